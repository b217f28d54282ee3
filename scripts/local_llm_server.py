"""llama.cpp's HTTP server, from the prebuilt xllamacpp wheel.

Run by scripts/local-llm.sh with the virtualenv's Python:

    python local_llm_server.py MODEL.gguf PORT CTX_SIZE THREADS

It serves llama.cpp's own server (OpenAI-compatible chat completions with
streaming and tool calls through the model's Jinja template, /health,
/props, /v1/models) on 127.0.0.1:PORT until SIGTERM or SIGINT. The wheel is
built for any x86-64 CPU (no -march=native, no AMX), so it needs no
compiler and does not fault on virtual machines that list AMX without it.
"""

import signal
import sys

import xllamacpp


def main() -> int:
    if len(sys.argv) != 5:
        print("usage: local_llm_server.py MODEL.gguf PORT CTX_SIZE THREADS", file=sys.stderr)
        return 2
    model, port, ctx_size, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.n_ctx = ctx_size
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.use_jinja = True
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    # Block the signals before the server starts its threads, so that they
    # inherit the mask and only sigwait below receives them.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    server = xllamacpp.Server(params)
    print(f"local-llm: llama.cpp server on {server.listening_address}", file=sys.stderr, flush=True)
    signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())

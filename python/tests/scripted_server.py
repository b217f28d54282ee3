"""A scripted OpenAI-compatible chat-completions server for end-to-end tests.

It plays the model: each agent request (one that offers tools) gets the next
scripted reply, a ``terminal`` tool call or, at the end, a final text. Every
request body is recorded. Replies carry a ``usage`` computed with the
package's exact token counter, as a real provider would report it. Requests
without tools (a host's auxiliary calls: titles, summaries) get a short text.
Streaming requests are answered as server-sent events.

Binds 127.0.0.1 on a free port; ``close()`` stops it.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

import context_engine


class ScriptedServer:
    def __init__(self, commands: List[str], final_text: str, model: str = "scripted-model"):
        self.commands = list(commands)
        self.final_text = final_text
        self.model = model
        self.requests: List[Dict[str, Any]] = []
        self.agent_requests: List[Dict[str, Any]] = []
        self._step = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send_json(self, code: int, body: Dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # model listing probes
                if self.path.rstrip("/").endswith("/models"):
                    self._send_json(
                        200,
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": server.model,
                                    "object": "model",
                                    "context_length": 64000,
                                }
                            ],
                        },
                    )
                else:
                    self._send_json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send_json(400, {"error": {"message": "bad json"}})
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                message = server.reply(body)
                usage = server.usage(body, message)
                if body.get("stream"):
                    self._stream(message, usage)
                else:
                    self._send_json(
                        200,
                        {
                            "id": f"chatcmpl-{len(server.requests)}",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": server.model,
                            "choices": [
                                {
                                    "index": 0,
                                    "message": message,
                                    "finish_reason": "tool_calls"
                                    if message.get("tool_calls")
                                    else "stop",
                                }
                            ],
                            "usage": usage,
                        },
                    )

            def _stream(self, message: Dict[str, Any], usage: Dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                base = {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": server.model,
                }
                delta: Dict[str, Any] = {"role": "assistant"}
                if message.get("content"):
                    delta["content"] = message["content"]
                if message.get("tool_calls"):
                    delta["tool_calls"] = [
                        dict(call, index=i) for i, call in enumerate(message["tool_calls"])
                    ]
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                chunks = [
                    dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": None}]),
                    dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]),
                    dict(base, choices=[], usage=usage),
                ]
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def reply(self, body: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            self.requests.append(body)
            if not body.get("tools"):
                return {"role": "assistant", "content": "ok"}
            self.agent_requests.append(body)
            step = self._step
            self._step += 1
        if step < len(self.commands):
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{step}",
                        "type": "function",
                        "function": {
                            "name": "terminal",
                            "arguments": json.dumps({"command": self.commands[step]}),
                        },
                    }
                ],
            }
        return {"role": "assistant", "content": self.final_text}

    @staticmethod
    def usage(body: Dict[str, Any], message: Dict[str, Any]) -> Dict[str, Any]:
        messages = body.get("messages") or []
        try:
            prompt = context_engine.count_tokens(messages)
        except ValueError:
            prompt = len(json.dumps(messages)) // 4
        prompt += context_engine.count_tokens(json.dumps(body.get("tools") or []))
        completion = context_engine.count_tokens(json.dumps(message))
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

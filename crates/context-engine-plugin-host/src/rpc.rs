//! The transport: one child process, JSON-RPC 2.0, one JSON object per line
//! on stdin/stdout, every read bounded by a deadline.
//!
//! Reading and writing happen on two small threads so the host never blocks
//! on a pipe: a plugin that stops reading its stdin or never answers costs at
//! most the call's timeout, after which the process is killed. Stderr is read
//! by a third thread into a bounded buffer the engine drains into its events.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wait_timeout::ChildExt;

use context_engine::plugin::FailureKind;
use context_engine::plugin::{PluginManifest, SpawnError};

/// The longest answer line accepted (a plugin cannot exhaust the host's
/// memory by never ending a line).
const MAX_LINE: u64 = 256 * 1024 * 1024;

/// Stderr lines kept between two drains; older ones are dropped.
const STDERR_LINES: usize = 256;

/// What the stdout reader thread reports.
enum ReadEvent {
    Line(String),
    Eof,
    Error(FailureKind, String),
}

/// Why a call produced no result.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The process misbehaved: it must be killed and restarted.
    Failure(FailureKind, String),
    /// A well-formed JSON-RPC error answer: the process is healthy.
    Remote { code: i64, message: String },
}

/// A running plugin process.
pub(crate) struct Connection {
    child: Child,
    writer: Option<Sender<String>>,
    lines: Receiver<ReadEvent>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    logs: Vec<String>,
    next_id: u64,
}

impl Connection {
    /// Starts the manifest's command in the plugin folder, with piped stdio.
    pub(crate) fn spawn(manifest: &PluginManifest) -> Result<Connection, SpawnError> {
        let program = manifest.program();
        let mut command = Command::new(&program);
        command
            .args(manifest.command.iter().skip(1))
            .current_dir(&manifest.dir)
            .envs(&manifest.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|source| SpawnError::Program {
            program: program.clone(),
            source,
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SpawnError::NoPipes);
        };
        let writer = spawn_writer(stdin);
        let (line_tx, lines) = mpsc::channel();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                let event = match (&mut reader).take(MAX_LINE).read_line(&mut line) {
                    Ok(0) => ReadEvent::Eof,
                    Ok(n) if n as u64 == MAX_LINE && !line.ends_with('\n') => ReadEvent::Error(
                        FailureKind::Malformed,
                        format!("a line longer than {MAX_LINE} bytes"),
                    ),
                    Ok(_) => ReadEvent::Line(line),
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        ReadEvent::Error(FailureKind::Malformed, format!("not UTF-8: {e}"))
                    }
                    Err(e) => {
                        ReadEvent::Error(FailureKind::Crash, format!("reading stdout failed: {e}"))
                    }
                };
                let stop = !matches!(event, ReadEvent::Line(_));
                if line_tx.send(event).is_err() || stop {
                    break;
                }
            }
        });
        let buffer = Arc::new(Mutex::new(VecDeque::new()));
        let sink = Arc::clone(&buffer);
        thread::spawn(move || {
            let reader = BufReader::new(stderr);
            for line in reader.lines() {
                let Ok(line) = line else { break };
                let mut buf = sink.lock().unwrap_or_else(|e| e.into_inner());
                if buf.len() == STDERR_LINES {
                    buf.pop_front();
                }
                buf.push_back(line);
            }
        });
        Ok(Connection {
            child,
            writer: Some(writer),
            lines,
            stderr: buffer,
            logs: Vec::new(),
            next_id: 1,
        })
    }

    /// The OS process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stderr lines captured since the last drain.
    pub(crate) fn drain_stderr(&self) -> Vec<String> {
        let mut buf = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        buf.drain(..).collect()
    }

    /// `log` notifications the plugin sent since the last drain.
    pub(crate) fn drain_logs(&mut self) -> Vec<String> {
        std::mem::take(&mut self.logs)
    }

    /// Sends a request and waits at most `timeout` for its answer.
    pub(crate) fn call(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(&request)?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(ReadEvent::Line(line)) => line,
                Ok(ReadEvent::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(CallError::Failure(FailureKind::Crash, self.exit_detail()));
                }
                Ok(ReadEvent::Error(kind, detail)) => {
                    return Err(CallError::Failure(kind, detail));
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(CallError::Failure(
                        FailureKind::Timeout,
                        format!("no answer within {} ms", timeout.as_millis()),
                    ));
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            match parse_answer(&line, id)? {
                Answer::Log(text) => self.logs.push(text),
                Answer::Result(value) => return Ok(value),
            }
        }
    }

    /// Sends a notification (no answer expected).
    pub(crate) fn notify(&mut self, method: &str, params: Value) -> Result<(), CallError> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    fn send(&mut self, message: &Value) -> Result<(), CallError> {
        let line = format!("{message}\n");
        let sent = self.writer.as_ref().is_some_and(|w| w.send(line).is_ok());
        if sent {
            Ok(())
        } else {
            Err(CallError::Failure(FailureKind::Crash, self.exit_detail()))
        }
    }

    /// "exited with ..." or "closed its stdout", with the last stderr line.
    fn exit_detail(&mut self) -> String {
        let status = self
            .child
            .wait_timeout(Duration::from_millis(200))
            .ok()
            .flatten();
        let mut detail = match status {
            Some(s) => format!("the process exited ({s})"),
            None => "the process closed its stdout".to_owned(),
        };
        let buf = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = buf.back() {
            detail.push_str(&format!("; last stderr line: {last}"));
        }
        detail
    }

    /// Polite shutdown: `shutdown` request, `exit` notification, stdin
    /// closed, then a wait of at most `timeout` before the process is
    /// killed. The exit status when it left by itself.
    pub(crate) fn shutdown(mut self, timeout: Duration) -> Option<ExitStatus> {
        let asked = self.call("shutdown", json!({}), timeout).is_ok();
        if asked {
            let _ = self.notify("exit", json!({}));
        }
        self.writer = None;
        let status = if asked {
            self.child.wait_timeout(timeout).ok().flatten()
        } else {
            None
        };
        if status.is_none() {
            self.kill();
        }
        status
    }

    /// Ends the process now.
    pub(crate) fn kill(&mut self) {
        self.writer = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// Writes lines to the plugin's stdin on its own thread: a plugin that
/// stops reading can fill the pipe, and that must block this thread, not
/// the host.
fn spawn_writer(mut stdin: ChildStdin) -> Sender<String> {
    let (tx, rx) = mpsc::channel::<String>();
    thread::spawn(move || {
        for line in rx {
            if stdin.write_all(line.as_bytes()).is_err() || stdin.flush().is_err() {
                break;
            }
        }
    });
    tx
}

enum Answer {
    Log(String),
    Result(Value),
}

/// Checks one stdout line against the request `id`.
fn parse_answer(line: &str, id: u64) -> Result<Answer, CallError> {
    let malformed = |why: String| CallError::Failure(FailureKind::Malformed, why);
    let value: Value = serde_json::from_str(line)
        .map_err(|e| malformed(format!("not JSON ({e}): {}", clip(line))))?;
    let Value::Object(object) = value else {
        return Err(malformed(format!("not a JSON object: {}", clip(line))));
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(malformed(format!(
            "missing \"jsonrpc\": \"2.0\": {}",
            clip(line)
        )));
    }
    if !object.contains_key("id") {
        // A notification from the plugin: only `log` is defined.
        if let Some(method) = object.get("method").and_then(Value::as_str) {
            let params = object.get("params").cloned().unwrap_or(Value::Null);
            let text = params
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| params.to_string());
            return Ok(Answer::Log(format!("{method}: {text}")));
        }
        return Err(malformed(format!("an answer without `id`: {}", clip(line))));
    }
    let got = object.get("id").cloned().unwrap_or(Value::Null);
    if got.as_u64() != Some(id) {
        return Err(CallError::Failure(
            FailureKind::WrongId,
            format!("expected id {id}, got {got}"),
        ));
    }
    if let Some(error) = object.get("error") {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        return Err(CallError::Remote { code, message });
    }
    match object.get("result") {
        Some(result) => Ok(Answer::Result(result.clone())),
        None => Err(malformed(format!(
            "an answer with neither `result` nor `error`: {}",
            clip(line)
        ))),
    }
}

/// At most 200 characters of a line, for messages.
fn clip(line: &str) -> String {
    let line = line.trim_end();
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_against_the_request() {
        assert!(matches!(
            parse_answer(r#"{"jsonrpc":"2.0","id":3,"result":true}"#, 3),
            Ok(Answer::Result(Value::Bool(true)))
        ));
        assert!(matches!(
            parse_answer(r#"{"jsonrpc":"2.0","id":4,"result":true}"#, 3),
            Err(CallError::Failure(FailureKind::WrongId, _))
        ));
        assert!(matches!(
            parse_answer("hello", 3),
            Err(CallError::Failure(FailureKind::Malformed, _))
        ));
        assert!(matches!(
            parse_answer(r#"{"id":3,"result":1}"#, 3),
            Err(CallError::Failure(FailureKind::Malformed, _))
        ));
        assert!(matches!(
            parse_answer(r#"{"jsonrpc":"2.0","id":3}"#, 3),
            Err(CallError::Failure(FailureKind::Malformed, _))
        ));
        assert!(matches!(
            parse_answer(
                r#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"no"}}"#,
                3
            ),
            Err(CallError::Remote { code: 1, .. })
        ));
        assert!(matches!(
            parse_answer(r#"{"jsonrpc":"2.0","method":"log","params":{"message":"hi"}}"#, 3),
            Ok(Answer::Log(t)) if t == "log: hi"
        ));
    }

    #[test]
    fn clip_keeps_short_lines_and_cuts_long_ones() {
        assert_eq!(clip("abc\n"), "abc");
        assert_eq!(clip(&"x".repeat(300)).chars().count(), 201);
    }
}

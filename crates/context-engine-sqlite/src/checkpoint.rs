//! The background checkpoint of the write-ahead log.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;

use rusqlite::{Connection, OpenFlags};

use super::BUSY_TIMEOUT;

/// Commits between two background checkpoints of the write-ahead log.
pub const CHECKPOINT_EVERY: usize = 64;

/// The write-ahead log's size, in pages, at which a commit checkpoints it
/// itself (the background checkpoint fell behind): four times SQLite's
/// default.
pub const AUTOCHECKPOINT_PAGES: u32 = 4_000;

/// The background checkpoint: a thread with its own connection that runs
/// a passive checkpoint when woken, and stops when the store is dropped.
#[derive(Debug)]
pub(super) struct Checkpointer {
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread for the store file at `path`; `None` when it cannot
    /// (the connection's own checkpoint then does the work).
    pub(super) fn start(path: &Path) -> Option<Checkpointer> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).ok()?;
        conn.busy_timeout(BUSY_TIMEOUT).ok()?;
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("ctx-store-checkpoint".into())
            .spawn(move || checkpoint_loop(&conn, &woken))
            .ok()?;
        Some(Checkpointer {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// Wakes the thread, unless a wake-up is already pending.
    pub(super) fn wake(&self) {
        if let Some(wake) = &self.wake {
            // Full: a wake-up is pending already; disconnected: stopping.
            let _ = wake.try_send(());
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Closing the channel ends the loop; the thread finishes the
        // checkpoint it is in, if any.
        drop(self.wake.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs a passive checkpoint each time it is woken (it never blocks the
/// writer; what it cannot copy now, the next one does). A failure is left
/// to the next one and to the writer's own automatic checkpoint.
fn checkpoint_loop(conn: &Connection, woken: &Receiver<()>) {
    while woken.recv().is_ok() {
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    }
}

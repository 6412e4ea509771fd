//! Telling refused processes why, on one thread for all of them.
//!
//! A refused process learns the reason only after the agent read its hello (else it could
//! find the socket closed under its hello and report a broken connection instead), and a
//! hello may never come. So refusals wait, briefly, on a thread of their own, not on the accept
//! loop; and on *one* thread with a bounded queue, so that a flood of connections from users
//! past their limits costs neither a thread each nor unbounded memory. A refusal that finds the
//! queue full is closed at once: that process sees its connection closed without the reason.

use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread;

use log::{debug, warn};

use crate::session;

/// Refusals waiting for their process's hello, at most.
pub const QUEUED_REFUSALS: usize = 64;

/// A refused connection and the reason to give it.
type Refused = (UnixStream, String);

/// The queue of refusals and the thread that answers them.
pub struct Refusals {
    queue: SyncSender<Refused>,
}

impl Refusals {
    /// Starts the thread that tells refused processes why, at most `queued` waiting.
    pub fn start(queued: usize) -> std::io::Result<Self> {
        let (refusals, refused) = Self::queue(queued);
        thread::Builder::new()
            .name("refusals".into())
            .spawn(move || {
                for (stream, why) in refused {
                    session::refuse(&stream, &why);
                }
            })?;
        Ok(refusals)
    }

    /// The queue without its thread: what [`Refusals::start`] answers from.
    fn queue(queued: usize) -> (Self, Receiver<Refused>) {
        let (queue, refused) = mpsc::sync_channel(queued);
        (Refusals { queue }, refused)
    }

    /// Tells the process on `stream` it is not served, and why, without waiting; true if the
    /// reason will reach it, false if the queue was full (the connection is closed now).
    pub fn refuse(&self, stream: UnixStream, why: String) -> bool {
        match self.queue.try_send((stream, why)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                debug!("too many refusals waiting: a connection closed without its reason");
                false
            }
            Err(TrySendError::Disconnected(_)) => {
                warn!("the refusals thread is gone: a connection closed without its reason");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma::transport::agent::protocol::{Frame, PROTOCOL_VERSION};

    #[test]
    fn a_refused_process_that_says_hello_learns_why() {
        let refusals = Refusals::start(4).unwrap();
        let (agent_end, process_end) = UnixStream::pair().unwrap();
        // The hello is sent first, so that the refusal's one-second wait for it cannot run
        // out however late the thread gets to it.
        Frame::Hello {
            version: PROTOCOL_VERSION,
        }
        .send(&process_end)
        .unwrap();
        assert!(refusals.refuse(agent_end, "full".into()));
        assert!(matches!(
            Frame::receive(&process_end),
            Ok(Frame::Refused(why)) if why == "full"
        ));
    }

    #[test]
    fn a_flood_of_refusals_never_waits_and_is_bounded() {
        // Nobody answers this queue: past its capacity, refusals are closed at once.
        let (refusals, refused) = Refusals::queue(3);
        let mut processes = Vec::new();
        let mut told = 0;
        for _ in 0..100 {
            let (agent_end, process_end) = UnixStream::pair().unwrap();
            told += usize::from(refusals.refuse(agent_end, "full".into()));
            processes.push(process_end);
        }
        assert_eq!(told, 3);
        // The connections not queued are closed: their processes read the end at once.
        let mut byte = [0u8; 1];
        assert_eq!(
            std::io::Read::read(&mut &processes[99], &mut byte).unwrap(),
            0
        );
        // Without its thread, nothing is queued any more.
        drop(refused);
        let (agent_end, _process_end) = UnixStream::pair().unwrap();
        assert!(!refusals.refuse(agent_end, "full".into()));
    }
}

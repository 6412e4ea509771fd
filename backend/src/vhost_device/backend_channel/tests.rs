//! The channel against a scripted front-end on a socket pair.

use std::os::fd::AsFd;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::*;
use crate::vhost_device::message::wants_reply;
use crate::vhost_device::shmem::{ShmemError, ShmemMapper, ShmemMapping};

const PAGE: u64 = 4096;

fn acked(features: VhostUserProtocolFeatures) -> u64 {
    features.bits()
}

fn all_features() -> u64 {
    acked(VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::SHMEM)
}

/// What the scripted front-end saw of one request.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    request: u32,
    shm_offset: u64,
    fds: usize,
    wants_reply: bool,
}

/// A front-end that reads `read_first` requests before it answers any, then answers each
/// request it reads with the next of `statuses` (requests past the script are answered 0)
/// until the channel closes; returns what it saw. Its reads give up after a minute, so that
/// a channel that waited for an answer before sending the next request fails the test
/// instead of hanging it.
fn scripted_frontend(
    socket: UnixStream,
    read_first: usize,
    statuses: Vec<u64>,
) -> JoinHandle<Vec<Seen>> {
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    thread::spawn(move || {
        let mut seen = Vec::new();
        let mut pending = Vec::new();
        let mut statuses = statuses.into_iter();
        let answer = |message: &Message, statuses: &mut dyn Iterator<Item = u64>| {
            if wants_reply(message) {
                let status = statuses.next().unwrap_or(0);
                Message::reply(message.request(), status)
                    .send(&socket)
                    .unwrap();
            }
        };
        while let Ok(Some(message)) = Message::receive(&socket) {
            seen.push(Seen {
                request: message.request(),
                shm_offset: u64::from_le_bytes(message.payload[16..24].try_into().unwrap()),
                fds: message.fds.len(),
                wants_reply: wants_reply(&message),
            });
            pending.push(message);
            if seen.len() >= read_first {
                for message in pending.drain(..) {
                    answer(&message, &mut statuses);
                }
            }
        }
        seen
    })
}

fn map_request(fd: BorrowedFd<'_>, shm_offset: u64) -> ShmemRequest<'_> {
    ShmemRequest {
        body: VhostUserMMap {
            shm_offset,
            len: PAGE,
            ..Default::default()
        },
        fd: Some(fd),
    }
}

fn devnull() -> std::fs::File {
    std::fs::File::open("/dev/null").unwrap()
}

#[test]
fn requests_go_back_to_back_and_answers_come_in_order() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let frontend = scripted_frontend(theirs, 2, vec![0, 1]);
    let mut channel = BackendChannel::new(ours, all_features());
    let file = devnull();
    let results = channel.exchange(&[
        map_request(file.as_fd(), 0),
        map_request(file.as_fd(), PAGE),
    ]);
    assert!(results[0].is_ok());
    assert!(results[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("status 1"));
    // A refusal does not break the channel.
    assert!(channel.exchange(&[map_request(file.as_fd(), 0)])[0].is_ok());
    drop(channel);
    let seen = frontend.join().unwrap();
    let map = BackendReq::SHMEM_MAP as u32;
    assert_eq!(
        seen,
        [0, PAGE, 0].map(|shm_offset| Seen {
            request: map,
            shm_offset,
            fds: 1,
            wants_reply: true,
        })
    );
}

#[test]
fn without_reply_ack_nothing_is_awaited() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let frontend = scripted_frontend(theirs, 1, vec![]);
    let mut channel = BackendChannel::new(ours, acked(VhostUserProtocolFeatures::SHMEM));
    let file = devnull();
    let results = channel.exchange(&[map_request(file.as_fd(), 0), ShmemRequest::unmap(0, PAGE)]);
    assert!(results.iter().all(Result::is_ok));
    drop(channel);
    let seen = frontend.join().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| !s.wants_reply));
    assert_eq!(
        (seen[1].request, seen[1].fds),
        (BackendReq::SHMEM_UNMAP as u32, 0)
    );
}

#[test]
fn without_shmem_nothing_is_sent() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let frontend = scripted_frontend(theirs, 1, vec![]);
    let mut channel = BackendChannel::new(ours, acked(VhostUserProtocolFeatures::REPLY_ACK));
    let file = devnull();
    let results = channel.exchange(&[map_request(file.as_fd(), 0)]);
    assert_eq!(
        results[0].as_ref().unwrap_err().kind(),
        io::ErrorKind::Unsupported
    );
    drop(channel);
    assert!(frontend.join().unwrap().is_empty());
}

#[test]
fn a_wrong_answer_breaks_the_channel_for_good() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let answering = thread::spawn(move || {
        let request = Message::receive(&theirs).unwrap().unwrap();
        // An answer to another request.
        Message::reply(request.request() + 1, 0)
            .send(&theirs)
            .unwrap();
        // Whatever follows: the channel must not send again.
        Message::receive(&theirs).unwrap().is_none()
    });
    let mut channel = BackendChannel::new(ours, all_features());
    let file = devnull();
    let results = channel.exchange(&[map_request(file.as_fd(), 0)]);
    assert_eq!(
        results[0].as_ref().unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    let again = channel.exchange(&[
        map_request(file.as_fd(), 0),
        map_request(file.as_fd(), PAGE),
    ]);
    assert!(again
        .iter()
        .all(|r| r.as_ref().unwrap_err().kind() == io::ErrorKind::BrokenPipe));
    drop(channel);
    assert!(answering.join().unwrap(), "nothing more was sent");
}

#[test]
fn a_closed_frontend_fails_what_it_did_not_answer() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    drop(theirs);
    let mut channel = BackendChannel::new(ours, all_features());
    let file = devnull();
    let results = channel.exchange(&[
        map_request(file.as_fd(), 0),
        map_request(file.as_fd(), PAGE),
    ]);
    assert!(results.iter().all(Result::is_err));
}

/// A mapper of a 16-page region whose channel goes to [`scripted_frontend`]`(2, statuses)`.
fn mapper_with(statuses: Vec<u64>) -> (ShmemMapper, JoinHandle<Vec<Seen>>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let frontend = scripted_frontend(theirs, 2, statuses);
    let mapper = ShmemMapper::new(16 * PAGE);
    mapper.set_channel(BackendChannel::new(ours, all_features()));
    (mapper, frontend)
}

/// (request, region offset) of everything the front-end saw, once `mapper` is gone.
fn requests_seen(mapper: ShmemMapper, frontend: JoinHandle<Vec<Seen>>) -> Vec<(u32, u64)> {
    drop(mapper);
    frontend
        .join()
        .unwrap()
        .iter()
        .map(|s| (s.request, s.shm_offset))
        .collect()
}

#[test]
fn a_partly_refused_batch_of_mappings_is_undone() {
    // The first mapping is done, the second refused; the undo of the first is answered 0.
    let (mapper, frontend) = mapper_with(vec![0, 1]);
    let file = devnull();
    let mapping = |page: u64| ShmemMapping {
        fd_offset: 0,
        shm_offset: page * PAGE,
        len: PAGE,
        writable: true,
    };
    let result = mapper.map_all(file.as_fd(), &[mapping(2), mapping(5)]);
    assert!(matches!(result, Err(ShmemError::Frontend(_))));
    // Checked before anything is sent.
    assert!(matches!(
        mapper.map_all(file.as_fd(), &[mapping(3), mapping(16)]),
        Err(ShmemError::BadRange { .. })
    ));
    let seen = requests_seen(mapper, frontend);
    let (map, unmap) = (BackendReq::SHMEM_MAP as u32, BackendReq::SHMEM_UNMAP as u32);
    assert_eq!(seen, [(map, 2 * PAGE), (map, 5 * PAGE), (unmap, 2 * PAGE)]);
}

#[test]
fn unmaps_go_together_and_a_bad_range_is_refused_alone() {
    // Both unmaps are read before either is answered; the second is refused.
    let (mapper, frontend) = mapper_with(vec![0, 1]);
    let results = mapper.unmap_all(&[(PAGE, PAGE), (PAGE + 1, PAGE), (4 * PAGE, 2 * PAGE)]);
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(ShmemError::BadRange { .. })));
    assert!(matches!(results[2], Err(ShmemError::Frontend(_))));
    let seen = requests_seen(mapper, frontend);
    let unmap = BackendReq::SHMEM_UNMAP as u32;
    assert_eq!(seen, [(unmap, PAGE), (unmap, 4 * PAGE)]);
}

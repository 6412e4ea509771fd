//! The guest's VIRTIO shared-memory region 0, mapped and unmapped through the frontend
//! (VHOST_USER_BACKEND_SHMEM_MAP/UNMAP).

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use parking_lot::Mutex;
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};

use super::backend_channel::{BackendChannel, ShmemRequest};

/// Page size the shared-memory region is mapped with.
pub const SHMEM_PAGE_SIZE: u64 = 4096;

/// Most queue-region mappings a guest may hold at once behind a front-end that counts them
/// as memory slots (it acknowledged `CONFIGURE_MEM_SLOTS`, as QEMU does). QEMU 11.1 makes every
/// SHMEM_MAP a memory region that its vhost-user memory listener offers the back-end, and
/// aborts once those and guest RAM's sections exceed `VHOST_USER_MAX_RAM_SLOTS` (512):
/// measured under qtest, the mapping after 170 CQ+QP pairs (3 mappings each) ended QEMU with
/// "vhost_user_add_remove_regions: Assertion `dev->mem->nregions <= VHOST_USER_MAX_RAM_SLOTS'
/// failed". 32 slots stay for guest RAM; past the budget, creating a queue is `QUOTA`. The
/// budget is per connection, QEMU's limit per VM: one vrdma device per VM (spec §10).
pub const SLOT_COUNTING_FRONTEND_MAPPINGS: usize = 480;

/// Errors of [`ShmemMapper`].
#[derive(Debug, thiserror::Error)]
pub enum ShmemError {
    /// The frontend gave no backend request channel (SET_BACKEND_REQ_FD) yet.
    #[error("the frontend opened no backend request channel")]
    NoChannel,
    /// Offset or length not page aligned, zero, or beyond the region.
    #[error("shared-memory range {offset:#x}+{len:#x} is invalid for a region of {size:#x} bytes")]
    BadRange {
        /// Offset in the region.
        offset: u64,
        /// Length.
        len: u64,
        /// Region size.
        size: u64,
    },
    /// The file offset is not page aligned.
    #[error("file offset {0:#x} is not page aligned")]
    BadFileOffset(u64),
    /// The frontend refused or failed the request, or did not negotiate
    /// VHOST_USER_PROTOCOL_F_SHMEM.
    #[error("the frontend did not map/unmap: {0}")]
    Frontend(#[source] io::Error),
}

/// One range of a file to map into region 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmemMapping {
    /// Offset in the file (page aligned).
    pub fd_offset: u64,
    /// Offset in the region (page aligned).
    pub shm_offset: u64,
    /// Length (whole pages).
    pub len: u64,
    /// Whether the guest may write it.
    pub writable: bool,
}

/// Sends VHOST_USER_BACKEND_SHMEM_MAP/UNMAP for region 0 over the backend request channel.
pub struct ShmemMapper {
    size: u64,
    /// The channel, replaced when the frontend sends a new one. Its own lock is held across an
    /// exchange; this one only to fetch it, so that a new channel never waits for the frontend
    /// (which may itself be waiting for the daemon to take it).
    channel: Mutex<Option<Arc<Mutex<BackendChannel>>>>,
}

impl ShmemMapper {
    pub(super) fn new(size: u64) -> Self {
        ShmemMapper {
            size,
            channel: Mutex::new(None),
        }
    }

    /// Size of region 0.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True once the frontend gave a backend request channel.
    pub fn has_channel(&self) -> bool {
        self.channel.lock().is_some()
    }

    /// Takes the frontend's backend request channel (from SET_BACKEND_REQ_FD).
    pub fn set_channel(&self, channel: BackendChannel) {
        *self.channel.lock() = Some(Arc::new(Mutex::new(channel)));
    }

    /// Maps `len` bytes of `fd` from `fd_offset` at `shm_offset` in region 0. The frontend
    /// mmaps the fd itself; the guest then reaches the memory without exits.
    pub fn map(
        &self,
        fd: BorrowedFd<'_>,
        fd_offset: u64,
        shm_offset: u64,
        len: u64,
        writable: bool,
    ) -> Result<(), ShmemError> {
        self.map_all(
            fd,
            &[ShmemMapping {
                fd_offset,
                shm_offset,
                len,
                writable,
            }],
        )
    }

    /// Maps every range of `fd` in `mappings`, or none: the requests go to the frontend back
    /// to back and their answers are awaited together. If one fails, those that succeeded are
    /// unmapped again and the first failure is returned.
    pub fn map_all(&self, fd: BorrowedFd<'_>, mappings: &[ShmemMapping]) -> Result<(), ShmemError> {
        let mut requests = Vec::with_capacity(mappings.len());
        for m in mappings {
            self.check_range(m.shm_offset, m.len)?;
            if !m.fd_offset.is_multiple_of(SHMEM_PAGE_SIZE)
                || m.fd_offset.checked_add(m.len).is_none()
            {
                return Err(ShmemError::BadFileOffset(m.fd_offset));
            }
            let flags = if m.writable {
                VhostUserMMapFlags::WRITABLE
            } else {
                VhostUserMMapFlags::default()
            };
            requests.push(ShmemRequest {
                body: VhostUserMMap {
                    shmid: 0,
                    fd_offset: m.fd_offset,
                    shm_offset: m.shm_offset,
                    len: m.len,
                    flags: flags.bits(),
                    ..Default::default()
                },
                fd: Some(fd),
            });
        }
        let channel = self.channel()?;
        let mut channel = channel.lock();
        let mut first_error = None;
        let mut mapped = Vec::new();
        for (request, result) in requests.iter().zip(channel.exchange(&requests)) {
            match result {
                Ok(()) => mapped.push(ShmemRequest::unmap(
                    request.body.shm_offset,
                    request.body.len,
                )),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let Some(error) = first_error else {
            return Ok(());
        };
        for (request, result) in mapped.iter().zip(channel.exchange(&mapped)) {
            if let Err(e) = result {
                let (offset, len) = (request.body.shm_offset, request.body.len);
                log::warn!("cannot unmap region range {offset:#x}+{len:#x} again: {e}");
            }
        }
        Err(ShmemError::Frontend(error))
    }

    /// Replaces `len` bytes at `shm_offset` of region 0 with an empty (inaccessible) range.
    pub fn unmap(&self, shm_offset: u64, len: u64) -> Result<(), ShmemError> {
        self.unmap_all(&[(shm_offset, len)])
            .pop()
            .unwrap_or(Err(ShmemError::NoChannel))
    }

    /// [`unmap`](Self::unmap) of every `(shm_offset, len)` range, sent back to back with one
    /// wait for the answers: one result per range.
    pub fn unmap_all(&self, ranges: &[(u64, u64)]) -> Vec<Result<(), ShmemError>> {
        let mut results: Vec<Result<(), ShmemError>> = ranges
            .iter()
            .map(|&(offset, len)| self.check_range(offset, len))
            .collect();
        let requests: Vec<ShmemRequest<'_>> = ranges
            .iter()
            .zip(&results)
            .filter(|(_, checked)| checked.is_ok())
            .map(|(&(offset, len), _)| ShmemRequest::unmap(offset, len))
            .collect();
        if requests.is_empty() {
            return results;
        }
        let answers = match self.channel() {
            Ok(channel) => channel.lock().exchange(&requests),
            Err(_) => {
                for result in results.iter_mut().filter(|r| r.is_ok()) {
                    *result = Err(ShmemError::NoChannel);
                }
                return results;
            }
        };
        let mut answers = answers.into_iter();
        for result in results.iter_mut().filter(|r| r.is_ok()) {
            *result = answers
                .next()
                .unwrap_or_else(|| Err(io::Error::other("no answer")))
                .map_err(ShmemError::Frontend);
        }
        results
    }

    fn channel(&self) -> Result<Arc<Mutex<BackendChannel>>, ShmemError> {
        self.channel.lock().clone().ok_or(ShmemError::NoChannel)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ShmemError> {
        let aligned = offset.is_multiple_of(SHMEM_PAGE_SIZE) && len.is_multiple_of(SHMEM_PAGE_SIZE);
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.size);
        if len == 0 || !aligned || !inside {
            return Err(ShmemError::BadRange {
                offset,
                len,
                size: self.size,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shmem_ranges_are_checked_before_any_channel() {
        let mapper = ShmemMapper::new(4 * SHMEM_PAGE_SIZE);
        assert!(matches!(
            mapper.unmap(SHMEM_PAGE_SIZE, 4 * SHMEM_PAGE_SIZE),
            Err(ShmemError::BadRange { .. })
        ));
        assert!(matches!(
            mapper.unmap(1, SHMEM_PAGE_SIZE),
            Err(ShmemError::BadRange { .. })
        ));
        assert!(matches!(
            mapper.unmap(0, 0),
            Err(ShmemError::BadRange { .. })
        ));
        assert!(matches!(
            mapper.unmap(0, SHMEM_PAGE_SIZE),
            Err(ShmemError::NoChannel)
        ));
    }
}

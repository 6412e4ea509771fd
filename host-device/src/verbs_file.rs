//! The uverbs character device of one context: opening it and executing legacy write commands.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::error::{DeviceError, Result};
use super::uverbs::{
    cmd, frame, frame_ex, Command, CommandWithResponse, DeviceMethodCall, ExQueryDevice,
    ExQueryDeviceResp, GidTableEntry, KickCall, RDMA_VERBS_IOCTL,
};

/// An open `/dev/infiniband/uverbsN`.
#[derive(Debug)]
pub struct VerbsFile {
    fd: OwnedFd,
}

impl VerbsFile {
    /// Opens the character device read/write, close-on-exec.
    pub fn open(path: &Path) -> Result<VerbsFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| DeviceError::Open {
                path: path.to_owned(),
                source,
            })?;
        Ok(VerbsFile { fd: file.into() })
    }

    /// Executes a command with a response: the kernel writes the core response followed by the
    /// driver's response `D` into one buffer the request points at.
    pub fn execute<C, D>(&self, mut req: C, driver_in: &[u8]) -> Result<(C::Response, D)>
    where
        C: CommandWithResponse,
        D: FromBytes + IntoBytes + Immutable + KnownLayout,
    {
        let core_len = size_of::<C::Response>();
        let out_len = core_len + size_of::<D>();
        // u64 words keep the buffer 8-byte aligned, as the kernel structs expect.
        let mut out = vec![0u64; out_len.div_ceil(8)];
        req.set_response(out.as_mut_ptr() as u64);
        let buf = frame(C::CODE, req.as_bytes(), driver_in, out_len).map_err(|source| {
            DeviceError::Frame {
                command: C::NAME,
                source,
            }
        })?;
        self.write_command(C::NAME, &buf)?;
        let bytes = &out.as_bytes()[..out_len];
        let core = C::Response::read_from_bytes(&bytes[..core_len]).map_err(|_| {
            DeviceError::InvalidReply {
                command: C::NAME,
                reason: "response buffer size mismatch".into(),
            }
        })?;
        let driver =
            D::read_from_bytes(&bytes[core_len..]).map_err(|_| DeviceError::InvalidReply {
                command: C::NAME,
                reason: "driver response size mismatch".into(),
            })?;
        Ok((core, driver))
    }

    /// The device's extended attributes (`IB_USER_VERBS_EX_CMD_QUERY_DEVICE`). The response
    /// buffer is larger than this build's struct, so that a newer kernel's longer answer fits
    /// (the kernel refuses a buffer shorter than its own struct); bytes an older kernel does
    /// not write stay zero.
    pub fn ex_query_device(&self) -> Result<ExQueryDeviceResp> {
        const NAME: &str = "EX_QUERY_DEVICE";
        const OUT_LEN: usize = 1024;
        // u64 words keep the buffer 8-byte aligned, as the kernel structs expect.
        let mut out = vec![0u64; OUT_LEN / 8];
        let buf = frame_ex(
            cmd::QUERY_DEVICE,
            ExQueryDevice::default().as_bytes(),
            out.as_mut_ptr() as u64,
            OUT_LEN,
        )
        .map_err(|source| DeviceError::Frame {
            command: NAME,
            source,
        })?;
        self.write_command(NAME, &buf)?;
        let (resp, _) = ExQueryDeviceResp::read_from_prefix(out.as_bytes()).map_err(|_| {
            DeviceError::InvalidReply {
                command: NAME,
                reason: "response buffer size mismatch".into(),
            }
        })?;
        Ok(resp)
    }

    /// Executes a command that has no response.
    pub fn execute_no_response<C: Command>(&self, req: &C, driver_in: &[u8]) -> Result<()> {
        let buf =
            frame(C::CODE, req.as_bytes(), driver_in, 0).map_err(|source| DeviceError::Frame {
                command: C::NAME,
                source,
            })?;
        self.write_command(C::NAME, &buf)
    }

    /// Every populated GID entry of the device (of driver `driver_id`), all ports
    /// (`UVERBS_METHOD_QUERY_GID_TABLE`), if there are at most `capacity`.
    pub fn query_gid_table(&self, driver_id: u32, capacity: usize) -> Result<Vec<GidTableEntry>> {
        const NAME: &str = "QUERY_GID_TABLE";
        let mut entries = vec![GidTableEntry::new_zeroed(); capacity];
        let mut count: u64 = 0;
        let mut call = DeviceMethodCall::query_gid_table(
            driver_id,
            entries.as_mut_ptr() as u64,
            capacity,
            &raw mut count as u64,
        )
        .ok_or(DeviceError::InvalidReply {
            command: NAME,
            reason: format!("{capacity} entries do not fit one call"),
        })?;
        // SAFETY: `call` names two buffers of this frame, `entries` (room for `capacity`
        // entries, the length the call states) and `count` (8 bytes), which outlive the call.
        unsafe { self.verbs_ioctl(NAME, &mut call) }?;
        let count = usize::try_from(count)
            .ok()
            .filter(|&n| n <= capacity)
            .ok_or(DeviceError::InvalidReply {
                command: NAME,
                reason: format!("{count} entries for a buffer of {capacity}"),
            })?;
        entries.truncate(count);
        Ok(entries)
    }

    /// GID entry `index` of `port` of the device (of driver `driver_id`)
    /// (`UVERBS_METHOD_QUERY_GID_ENTRY`).
    pub fn query_gid_entry(&self, driver_id: u32, port: u8, index: u32) -> Result<GidTableEntry> {
        const NAME: &str = "QUERY_GID_ENTRY";
        let mut entry = GidTableEntry::new_zeroed();
        let mut call =
            DeviceMethodCall::query_gid_entry(driver_id, port, index, &raw mut entry as u64);
        // SAFETY: `call` names one buffer of this frame, `entry`, of the size the call states,
        // which outlives the call.
        unsafe { self.verbs_ioctl(NAME, &mut call) }?;
        Ok(entry)
    }

    /// Starts rxe's send processing of the QP `qp_handle` names (an empty POST_SEND, the
    /// [`KickCall`] drivers with the host context make too).
    pub fn kick_send(&self, qp_handle: u32) -> Result<()> {
        let mut call = KickCall::new(qp_handle);
        call.aim();
        // SAFETY: `call` was aimed where it lies: its attributes name its own request and
        // response fields, of the lengths they state, live for the whole call.
        unsafe { self.verbs_ioctl("POST_SEND", &mut call) }
    }

    /// Issues the ioctl-framed verbs method `call` (header and attributes), named `name` in
    /// errors.
    ///
    /// # Safety
    /// Every user address in `call`'s attributes points at a live buffer at least as long as
    /// the attribute states. The kernel writes those buffers, and the `flags` of the attributes
    /// in `call` itself (VALID_OUTPUT), only during the call, through a pointer derived from
    /// this mutable borrow.
    unsafe fn verbs_ioctl<T: IntoBytes>(&self, name: &'static str, call: &mut T) -> Result<()> {
        // SAFETY: the caller's contract; the fd is this context's uverbs file.
        let ret = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                RDMA_VERBS_IOCTL as _,
                std::ptr::from_mut(call).cast::<libc::c_void>(),
            )
        };
        if ret < 0 {
            return Err(last_command_error(name));
        }
        Ok(())
    }

    fn write_command(&self, name: &'static str, buf: &[u8]) -> Result<()> {
        // SAFETY: any user address the command carries points at a live buffer of the
        // caller's: the response of `execute`, sized for exactly the header's `out_words`, or a
        // driver output such as the mminfo of rxe's MODIFY_SRQ. The kernel writes those only
        // during this call.
        unsafe { write_command(self.fd.as_fd(), name, buf) }
    }
}

/// The failure of command `name` with the thread's errno.
fn last_command_error(name: &'static str) -> DeviceError {
    let errno = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO);
    DeviceError::Command {
        command: name,
        errno,
    }
}

/// Writes one command (`buf`, header included) to a uverbs or rdma_cm character device, which
/// accepts it whole or fails it with an errno.
///
/// # Safety
/// Every user address inside `buf` (response buffers, option values) must point at memory of
/// this process that is valid for the access the command makes, for the duration of the call.
pub(crate) unsafe fn write_command(
    fd: BorrowedFd<'_>,
    name: &'static str,
    buf: &[u8],
) -> Result<()> {
    // SAFETY: `buf` is readable for its length; the addresses inside it are the caller's
    // promise.
    let written = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    if written < 0 {
        return Err(last_command_error(name));
    }
    let written = written.unsigned_abs();
    if written != buf.len() {
        return Err(DeviceError::ShortWrite {
            command: name,
            written,
            len: buf.len(),
        });
    }
    Ok(())
}

impl AsFd for VerbsFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

//! A client of QEMU's qtest protocol (see QEMU's `system/qtest.c` and
//! `tests/qtest/libqtest.c`).
//!
//! QEMU runs with `-accel qtest` (no guest CPU) and connects to a Unix socket this client
//! listens on. Requests are text lines (`outl 0xcf8 0x80000800`, `readl 0xe0000000`, …), each
//! answered by one line starting with `OK` or `FAIL`. Once `irq_intercept_in` is set, QEMU also
//! sends `IRQ raise N` / `IRQ lower N` lines whenever an intercepted line changes level,
//! interleaved with the replies at any point.
//!
//! A reader thread takes every line off the socket: IRQ lines update [`IrqState`] (so an
//! interrupt is seen even while no request is in flight), everything else is the reply to the
//! one request in flight. Requests are serialised by a mutex; every wait is bounded. After a
//! request times out the connection is out of step and every later request fails at once.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::error::{QtestError, Result};
use super::protocol::{
    apply_irq, decode_hex, encode_hex, parse_irq, parse_number, parse_reply, short, IrqState,
};

/// How much of QEMU's stderr is kept for error messages.
const STDERR_KEEP: usize = 64 * 1024;

/// What [`Qtest::spawn`] starts.
#[derive(Debug, Clone)]
pub struct QemuCommand {
    /// The QEMU binary (a path, or a name looked up on PATH).
    pub binary: OsString,
    /// Arguments besides the qtest ones, which the client adds.
    pub args: Vec<String>,
    /// Bound of the wait for QEMU to connect.
    pub connect_timeout: Duration,
    /// Bound of the wait for each reply.
    pub reply_timeout: Duration,
}

impl QemuCommand {
    /// `$QTEST_QEMU_BINARY` (QEMU's own qtest convention) or `qemu-system-x86_64` from PATH.
    pub fn default_binary() -> OsString {
        std::env::var_os("QTEST_QEMU_BINARY").unwrap_or_else(|| "qemu-system-x86_64".into())
    }
}

/// Whether `binary` runs under qtest: it answers a request on an empty machine. (Debian 12's
/// QEMU 7.2 has no qtest accelerator; QEMU does not list it in `-accel help` either way.)
pub fn supports_qtest(binary: &std::ffi::OsStr) -> bool {
    let command = QemuCommand {
        binary: binary.to_os_string(),
        args: ["-machine", "none", "-display", "none", "-nodefaults"]
            .map(String::from)
            .to_vec(),
        connect_timeout: Duration::from_secs(30),
        reply_timeout: Duration::from_secs(30),
    };
    Qtest::spawn(&command).is_ok_and(|qtest| qtest.request("endianness").is_ok())
}

/// What the reader thread and the clients share.
#[derive(Default)]
struct Shared {
    irq: Mutex<IrqEvents>,
    irq_changed: Condvar,
    stderr: Mutex<String>,
}

#[derive(Default)]
struct IrqEvents {
    state: IrqState,
    /// The socket closed: no more lines will come.
    closed: bool,
}

/// The request side of the connection.
struct Connection {
    stream: UnixStream,
    replies: Receiver<String>,
    /// Why the connection can no longer be used, once it cannot.
    broken: Option<String>,
}

/// A running QEMU under qtest control; killed when dropped.
pub struct Qtest {
    conn: Mutex<Connection>,
    shared: Arc<Shared>,
    child: Mutex<Child>,
    status: Mutex<Option<ExitStatus>>,
    pid: u32,
    reply_timeout: Duration,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Requests sent so far.
    requests: AtomicU64,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> QtestError {
    let what = what.into();
    move |source| QtestError::Io { what, source }
}

/// A socket path unique to this process and call.
fn socket_path() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "vrdma-qtest-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

impl Qtest {
    /// Starts QEMU with `command` plus `-qtest unix:SOCKET -qtest-log /dev/null -accel qtest`
    /// and waits for it to connect.
    pub fn spawn(command: &QemuCommand) -> Result<Qtest> {
        let path = socket_path();
        let _ = std::fs::remove_file(&path);
        let listener =
            UnixListener::bind(&path).map_err(io(format!("binding {}", path.display())))?;
        let result = Self::spawn_on(command, &listener, &path);
        let _ = std::fs::remove_file(&path);
        result
    }

    fn spawn_on(command: &QemuCommand, listener: &UnixListener, path: &Path) -> Result<Qtest> {
        let mut cmd = Command::new(&command.binary);
        cmd.args(&command.args)
            .arg("-qtest")
            .arg(format!("unix:{}", path.display()))
            // Without -qtest-log QEMU logs every request to stderr.
            .args(["-qtest-log", "/dev/null", "-accel", "qtest"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the child between fork and exec and calls only prctl,
        // which is async-signal-safe; it touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                // If this process dies, QEMU must not live on holding the backend's guest.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        log::debug!("starting {}", crate::host::describe(&cmd));
        let mut child = cmd
            .spawn()
            .map_err(io(format!("starting {}", command.binary.to_string_lossy())))?;
        let shared = Arc::new(Shared::default());
        let mut threads = Vec::new();
        if let Some(stderr) = child.stderr.take() {
            let shared = shared.clone();
            threads.push(std::thread::spawn(move || collect_stderr(stderr, &shared)));
        }
        let stream = match accept(listener, &mut child, command.connect_timeout) {
            Ok(stream) => stream,
            Err(e) => {
                let _ = child.kill();
                let status = child.wait().ok();
                for thread in threads {
                    let _ = thread.join();
                }
                let stderr = shared.stderr.lock().clone();
                return Err(match (e, status) {
                    (AcceptError::Exited(status), _) => QtestError::Exited {
                        when: "exited before connecting".into(),
                        status: status.to_string(),
                        stderr,
                    },
                    (AcceptError::Timeout, _) => QtestError::NoConnection {
                        timeout: command.connect_timeout,
                        stderr,
                    },
                    (AcceptError::Io(source), _) => QtestError::Io {
                        what: "accepting QEMU's qtest connection".into(),
                        source,
                    },
                });
            }
        };
        stream
            .set_write_timeout(Some(command.reply_timeout))
            .map_err(io("setting the qtest socket's write timeout"))?;
        let read_half = stream
            .try_clone()
            .map_err(io("duplicating the qtest socket"))?;
        let (tx, rx) = mpsc::channel();
        {
            let shared = shared.clone();
            threads.push(std::thread::spawn(move || {
                read_lines(read_half, &tx, &shared)
            }));
        }
        let pid = child.id();
        Ok(Qtest {
            conn: Mutex::new(Connection {
                stream,
                replies: rx,
                broken: None,
            }),
            shared,
            child: Mutex::new(child),
            status: Mutex::new(None),
            pid,
            reply_timeout: command.reply_timeout,
            threads: Mutex::new(threads),
            requests: AtomicU64::new(0),
        })
    }

    /// Requests sent so far (each is one round trip to QEMU).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What QEMU wrote to stderr so far (the last [`STDERR_KEEP`] bytes).
    pub fn stderr(&self) -> String {
        self.shared.stderr.lock().clone()
    }

    /// QEMU's exit status, if it exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        // The two locks are never held together (see `kill`).
        if let Some(status) = *self.status.lock() {
            return Some(status);
        }
        let status = self.child.lock().try_wait().ok().flatten();
        if status.is_some() {
            *self.status.lock() = status;
        }
        status
    }

    /// Kills QEMU (SIGKILL) and reaps it; later requests fail.
    pub fn kill(&self) {
        let status = {
            let mut child = self.child.lock();
            let _ = child.kill();
            child.wait().ok()
        };
        if status.is_some() {
            *self.status.lock() = status;
        }
    }

    /// Sends one request and returns what follows `OK` in its reply (trimmed).
    pub fn request(&self, command: &str) -> Result<String> {
        debug_assert!(!command.contains('\n'));
        let mut conn = self.conn.lock();
        if let Some(why) = &conn.broken {
            return Err(QtestError::Broken(why.clone()));
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut line = String::with_capacity(command.len() + 1);
        line.push_str(command);
        line.push('\n');
        if let Err(e) = conn.stream.write_all(line.as_bytes()) {
            let error = self.gone(command, Some(e));
            conn.broken = Some(error.to_string());
            return Err(error);
        }
        let reply = match conn.replies.recv_timeout(self.reply_timeout) {
            Ok(reply) => reply,
            Err(RecvTimeoutError::Timeout) => {
                let error = QtestError::Timeout {
                    command: short(command),
                    timeout: self.reply_timeout,
                    stderr: self.stderr(),
                };
                conn.broken = Some(error.to_string());
                return Err(error);
            }
            Err(RecvTimeoutError::Disconnected) => {
                let error = self.gone(command, None);
                conn.broken = Some(error.to_string());
                return Err(error);
            }
        };
        drop(conn);
        parse_reply(command, &reply)
    }

    /// The error for a request that found QEMU gone.
    fn gone(&self, command: &str, write_error: Option<std::io::Error>) -> QtestError {
        // QEMU's exit closes the socket before the process is reaped: give it a moment.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut status = self.exit_status();
        while status.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            status = self.exit_status();
        }
        match (status, write_error) {
            (Some(status), _) => QtestError::Exited {
                when: format!("exited during `{}`", short(command)),
                status: status.to_string(),
                stderr: self.stderr(),
            },
            (None, Some(source)) => QtestError::Io {
                what: format!("sending `{}`", short(command)),
                source,
            },
            (None, None) => QtestError::Exited {
                when: format!("closed the qtest connection during `{}`", short(command)),
                status: "still running".into(),
                stderr: self.stderr(),
            },
        }
    }

    /// A request whose reply is `OK VALUE` with a number.
    fn request_value(&self, command: &str) -> Result<u64> {
        let rest = self.request(command)?;
        parse_number(&rest).ok_or_else(|| QtestError::BadReply {
            command: short(command),
            reply: rest,
        })
    }

    /// `outb`/`outw`/`outl`: an I/O port write of 1, 2 or 4 bytes.
    pub fn port_write(&self, port: u16, size: usize, value: u32) -> Result<()> {
        let op = match size {
            1 => "outb",
            2 => "outw",
            4 => "outl",
            _ => return Err(invalid_size("port write", size)),
        };
        self.request(&format!("{op} {port:#x} {value:#x}"))
            .map(drop)
    }

    /// `inb`/`inw`/`inl`: an I/O port read of 1, 2 or 4 bytes.
    pub fn port_read(&self, port: u16, size: usize) -> Result<u32> {
        let op = match size {
            1 => "inb",
            2 => "inw",
            4 => "inl",
            _ => return Err(invalid_size("port read", size)),
        };
        let command = format!("{op} {port:#x}");
        let value = self.request_value(&command)?;
        u32::try_from(value).map_err(|_| QtestError::BadReply {
            command,
            reply: format!("{value:#x}"),
        })
    }

    /// `readb`/`readw`/`readl`/`readq`: one memory read of 1, 2, 4 or 8 bytes.
    pub fn mem_read(&self, addr: u64, size: usize) -> Result<u64> {
        let op = match size {
            1 => "readb",
            2 => "readw",
            4 => "readl",
            8 => "readq",
            _ => return Err(invalid_size("memory read", size)),
        };
        self.request_value(&format!("{op} {addr:#x}"))
    }

    /// `writeb`/`writew`/`writel`/`writeq`: one memory write of 1, 2, 4 or 8 bytes.
    pub fn mem_write(&self, addr: u64, size: usize, value: u64) -> Result<()> {
        let op = match size {
            1 => "writeb",
            2 => "writew",
            4 => "writel",
            8 => "writeq",
            _ => return Err(invalid_size("memory write", size)),
        };
        self.request(&format!("{op} {addr:#x} {value:#x}"))
            .map(drop)
    }

    /// `read`: `buf.len()` bytes of memory at `addr`.
    pub fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        // QEMU asserts on a zero-length read.
        if buf.is_empty() {
            return Ok(());
        }
        let command = format!("read {addr:#x} {:#x}", buf.len());
        let rest = self.request(&command)?;
        decode_hex(&rest, buf).ok_or_else(|| QtestError::BadReply {
            command,
            reply: short(&rest),
        })
    }

    /// `write`: `data` to memory at `addr`.
    pub fn write_bytes(&self, addr: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut command = format!("write {addr:#x} {:#x} 0x", data.len());
        encode_hex(data, &mut command);
        self.request(&command).map(drop)
    }

    /// `irq_intercept_in QOM_PATH`: report the levels of that device's input lines.
    pub fn irq_intercept_in(&self, qom_path: &str) -> Result<()> {
        self.request(&format!("irq_intercept_in {qom_path}"))
            .map(drop)
    }

    /// Interrupt lines as last reported.
    pub fn irq_state(&self) -> IrqState {
        self.shared.irq.lock().state.clone()
    }

    /// Waits up to `timeout` until a line is high or more than `raises_seen` raises were
    /// reported. Returns the state then, or `None` on timeout. Fails if QEMU went away.
    pub fn wait_irq(&self, raises_seen: u64, timeout: Duration) -> Result<Option<IrqState>> {
        let deadline = Instant::now() + timeout;
        let mut events = self.shared.irq.lock();
        loop {
            if events.state.any_high() || events.state.raises > raises_seen {
                return Ok(Some(events.state.clone()));
            }
            if events.closed {
                drop(events);
                return Err(self.gone("waiting for an interrupt", None));
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Ok(None);
            };
            self.shared.irq_changed.wait_for(&mut events, left);
        }
    }
}

impl Drop for Qtest {
    fn drop(&mut self) {
        self.kill();
        let _ = self.conn.lock().stream.shutdown(std::net::Shutdown::Both);
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
    }
}

enum AcceptError {
    Exited(ExitStatus),
    Timeout,
    Io(std::io::Error),
}

/// Accepts QEMU's connection, watching that QEMU is still alive.
fn accept(
    listener: &UnixListener,
    child: &mut Child,
    timeout: Duration,
) -> std::result::Result<UnixStream, AcceptError> {
    listener.set_nonblocking(true).map_err(AcceptError::Io)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(AcceptError::Io)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(AcceptError::Io(e)),
        }
        if let Some(status) = child.try_wait().map_err(AcceptError::Io)? {
            return Err(AcceptError::Exited(status));
        }
        if Instant::now() >= deadline {
            return Err(AcceptError::Timeout);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The reader thread: IRQ lines to `shared`, everything else to `replies`.
fn read_lines(stream: UnixStream, replies: &mpsc::Sender<String>, shared: &Shared) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if let Some(irq) = parse_irq(text) {
            log::trace!("{text}");
            let mut events = shared.irq.lock();
            apply_irq(&mut events.state, irq);
            drop(events);
            shared.irq_changed.notify_all();
        } else if replies.send(text.to_string()).is_err() {
            break;
        }
    }
    shared.irq.lock().closed = true;
    shared.irq_changed.notify_all();
}

fn collect_stderr(mut stderr: impl Read, shared: &Shared) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf) {
        if n == 0 {
            break;
        }
        let mut kept = shared.stderr.lock();
        kept.push_str(&String::from_utf8_lossy(&buf[..n]));
        if kept.len() > STDERR_KEEP {
            let mut cut = kept.len() - STDERR_KEEP;
            while !kept.is_char_boundary(cut) {
                cut += 1;
            }
            kept.drain(..cut);
        }
    }
}

fn invalid_size(what: &str, size: usize) -> QtestError {
    QtestError::InvalidRequest(format!("{what} of {size} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake QEMU: a shell script that connects to the socket and answers requests, to check
    /// the client's handling of interleaved IRQ lines, FAIL and an early exit without QEMU.
    #[test]
    fn talks_to_a_scripted_server() {
        let Some(python) = crate::host::which("python3") else {
            eprintln!("skipped: no python3 to play QEMU");
            return;
        };
        let script = r#"
import socket, sys
path = next(a for a in sys.argv if a.startswith("unix:"))[5:]
s = socket.socket(socket.AF_UNIX); s.connect(path)
f = s.makefile("rwb", buffering=0)
for line in f:
    words = line.decode().split()
    if words[0] == "readl":
        f.write(b"IRQ raise 17\nOK 0x0000000012345678\n")
    elif words[0] == "read":
        f.write(b"OK 0x" + b"ab" * int(words[2], 16) + b"\n")
    elif words[0] == "inl":
        f.write(b"IRQ lower 17\nOK 0xffff\n")
    elif words[0] == "quit":
        sys.exit(3)
    else:
        f.write(b"FAIL Unknown command '" + words[0].encode() + b"'\n")
"#;
        let command = QemuCommand {
            binary: python.into_os_string(),
            args: vec!["-c".into(), script.into()],
            connect_timeout: Duration::from_secs(20),
            reply_timeout: Duration::from_secs(10),
        };
        let qtest = Qtest::spawn(&command).unwrap();
        assert_eq!(qtest.mem_read(0x1000, 4).unwrap(), 0x1234_5678);
        let state = qtest
            .wait_irq(0, Duration::from_secs(5))
            .unwrap()
            .expect("the raise was seen");
        assert!(state.high[17] && state.raises == 1);
        let mut buf = [0u8; 3];
        qtest.read_bytes(0x2000, &mut buf).unwrap();
        assert_eq!(buf, [0xab; 3]);
        assert_eq!(qtest.port_read(0xcfc, 4).unwrap(), 0xffff);
        assert!(!qtest.irq_state().any_high());
        assert!(qtest
            .wait_irq(1, Duration::from_millis(50))
            .unwrap()
            .is_none());
        let err = qtest.mem_write(0x1000, 4, 1).unwrap_err();
        assert!(matches!(err, QtestError::Failed { .. }), "{err}");
        let err = qtest.request("quit").unwrap_err();
        assert!(matches!(err, QtestError::Exited { .. }), "{err}");
        assert!(matches!(
            qtest.port_read(0xcfc, 4).unwrap_err(),
            QtestError::Broken(_)
        ));
    }

    #[test]
    fn reports_a_qemu_that_exits_before_connecting() {
        let command = QemuCommand {
            binary: "sh".into(),
            args: vec!["-c".into(), "echo 'bad option' >&2; exit 1".into()],
            connect_timeout: Duration::from_secs(20),
            reply_timeout: Duration::from_secs(10),
        };
        let err = Qtest::spawn(&command).err().expect("spawn fails");
        let text = err.to_string();
        assert!(text.contains("bad option"), "{text}");
    }
}

//! The guest's requests to the host side, one line each way over a virtio-serial port: the
//! guest names a step ("bypass-ready", "live", "rebooted", …), the host side acts and answers
//! `ok <detail>` or `error <why>`.
//!
//! The port survives a guest reboot: QEMU's chardev stays connected, and the guest opens the
//! port again in its next boot.

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{Error, IoContext, Result};
use crate::relay::open_serial_port;

/// Guest side: the open control port.
pub struct ControlClient {
    reader: BufReader<File>,
    writer: File,
}

impl ControlClient {
    /// Opens the serial port `name`.
    pub fn open(name: &str) -> Result<Self> {
        let writer = open_serial_port(name)?;
        let reader = BufReader::new(
            writer
                .try_clone()
                .context(|| "duplicating the control port".into())?,
        );
        Ok(Self { reader, writer })
    }

    /// Sends `request` and waits for the answer; `Ok(detail)` for `ok <detail>`.
    pub fn request(&mut self, request: &str) -> Result<String> {
        writeln!(self.writer, "{request}")
            .and_then(|()| self.writer.flush())
            .context(|| format!("sending {request:?}"))?;
        let mut answer = String::new();
        self.reader
            .read_line(&mut answer)
            .context(|| format!("reading the answer to {request:?}"))?;
        parse_answer(request, &answer)
    }
}

fn parse_answer(request: &str, answer: &str) -> Result<String> {
    let answer = answer.trim_end();
    match answer.split_once(' ').unwrap_or((answer, "")) {
        ("ok", detail) => Ok(detail.to_string()),
        ("error", why) => Err(Error::Scenario(format!(
            "the host side refused {request:?}: {why}"
        ))),
        _ => Err(Error::Scenario(format!(
            "no answer to {request:?} (got {answer:?}): the host side is gone"
        ))),
    }
}

/// Host side: answers every request on the control port's chardev at `chardev` with
/// `handle` until `guest_gone` is set. Connects again whenever QEMU's socket closes or is not
/// there yet (QEMU starting, or booting the guest once more).
pub fn serve(
    chardev: &Path,
    guest_gone: &AtomicBool,
    mut handle: impl FnMut(&str) -> Result<String>,
) -> Result<()> {
    while !guest_gone.load(Ordering::Acquire) {
        let Ok(stream) = UnixStream::connect(chardev) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        // Wake up now and then to see whether the guest is gone.
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .context(|| "configuring the control socket".into())?;
        let mut writer = stream
            .try_clone()
            .context(|| "duplicating the control socket".into())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        loop {
            match reader.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) if !line.ends_with('\n') => continue,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if guest_gone.load(Ordering::Acquire) {
                        return Ok(());
                    }
                    continue;
                }
                Err(_) => break,
            }
            let request = line.trim().to_string();
            line.clear();
            if request.is_empty() {
                continue;
            }
            let answer = match handle(&request) {
                Ok(detail) => format!("ok {detail}"),
                Err(e) => format!("error {}", e.to_string().replace('\n', " | ")),
            };
            if writeln!(writer, "{answer}").is_err() {
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse() {
        assert_eq!(parse_answer("live", "ok qp=2\n").unwrap(), "qp=2");
        assert_eq!(parse_answer("live", "ok\n").unwrap(), "");
        let refused = parse_answer("live", "error no QPs\n")
            .unwrap_err()
            .to_string();
        assert!(refused.contains("no QPs"), "{refused}");
        let gone = parse_answer("live", "").unwrap_err().to_string();
        assert!(gone.contains("host side is gone"), "{gone}");
    }

    #[test]
    fn the_host_side_answers_each_request() {
        let dir = std::env::temp_dir().join(format!("vrdma-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let gone = std::sync::Arc::new(AtomicBool::new(false));
        let server = {
            let (path, gone) = (path.clone(), gone.clone());
            std::thread::spawn(move || {
                serve(&path, &gone, |request| match request {
                    "ping" => Ok("pong".into()),
                    other => Err(Error::Scenario(format!("unknown {other}\nsecond line"))),
                })
            })
        };
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut ask = |request: &str| {
            writeln!(writer, "{request}").unwrap();
            let mut answer = String::new();
            reader.read_line(&mut answer).unwrap();
            answer
        };
        assert_eq!(ask("ping"), "ok pong\n");
        assert_eq!(ask("what"), "error unknown what | second line\n");
        // QEMU's socket closing is not the end: the guest may boot again.
        drop(writer);
        drop(reader);
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        writeln!(writer, "ping").unwrap();
        let mut answer = String::new();
        reader.read_line(&mut answer).unwrap();
        assert_eq!(answer, "ok pong\n");
        gone.store(true, Ordering::Release);
        server.join().unwrap().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! The README's QEMU command line, run as a new user would, inside the rxe VM: does it bring
//! the device up as the README says (PCI 1af4:1066 with the shared-memory BAR)?
//!
//! The command is taken from the README itself (the block after [`MARKER`]), so the test fails
//! when the documentation drifts. Only what cannot work in the test VM is changed: KVM becomes
//! TCG (the firmware assigns the BARs, so `info pci` shows them), the guest disk is dropped,
//! memory is made smaller and the backend socket is the test's.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The README line right before the QEMU command block.
pub const MARKER: &str = "<!-- qemu-command-line: checked by `vrdma-vm test qtest-pingpong` -->";

/// What `info pci` showed for the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSeen {
    /// `vendor:device` as QEMU printed it.
    pub id: String,
    /// The shared-memory BAR's size in bytes.
    pub shm_bar_size: u64,
    /// The QEMU command line that was run.
    pub command: Vec<String>,
}

/// The QEMU invocation in the README block after [`MARKER`], continuation lines joined and
/// comments dropped, split into words (the README uses no quoting).
pub fn readme_command(readme: &str) -> Result<Vec<String>> {
    let missing = |what: &str| Error::Scenario(format!("README: {what}"));
    let after = readme
        .split_once(MARKER)
        .ok_or_else(|| missing("the QEMU command-line marker is gone"))?
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .ok_or_else(|| missing("no ```sh block after the marker"))?
        .0;
    let mut joined = String::new();
    for line in block.lines() {
        let line = line.split_once(" #").map_or(line, |(code, _)| code);
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(continued) => {
                joined.push_str(continued);
                joined.push(' ');
            }
            None => {
                joined.push_str(line);
                joined.push('\n');
            }
        }
    }
    joined
        .lines()
        .find(|line| line.starts_with("qemu-system-x86_64 "))
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .ok_or_else(|| missing("no qemu-system-x86_64 command in the block"))
}

/// `command` adapted to the test VM: TCG instead of KVM, no disk, `memory` instead of the
/// README's RAM size, the backend socket at `socket`, a monitor on stdio.
pub fn adapt(command: &[String], socket: &Path, memory: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut words = command.iter().skip(1);
    let mut saw_device = false;
    while let Some(word) = words.next() {
        let value = |words: &mut dyn Iterator<Item = &String>| {
            words
                .next()
                .cloned()
                .ok_or_else(|| Error::Scenario(format!("README: {word} without a value")))
        };
        match word.as_str() {
            "-cpu" | "-drive" => {
                value(&mut words)?;
            }
            "-machine" => {
                let machine = value(&mut words)?
                    .split(',')
                    .filter(|option| !option.starts_with("accel="))
                    .collect::<Vec<_>>()
                    .join(",");
                out.extend(["-machine".into(), machine]);
            }
            "-m" => {
                value(&mut words)?;
                out.extend(["-m".into(), memory.into()]);
            }
            "-object" => {
                let object = value(&mut words)?
                    .split(',')
                    .map(|option| match option.strip_prefix("size=") {
                        Some(_) => format!("size={memory}"),
                        None => option.to_owned(),
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                out.extend(["-object".into(), object]);
            }
            "-chardev" => {
                let chardev = value(&mut words)?
                    .split(',')
                    .map(|option| match option.strip_prefix("path=") {
                        Some(_) => format!("path={}", socket.display()),
                        None => option.to_owned(),
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                out.extend(["-chardev".into(), chardev]);
            }
            "-device" => {
                let device = value(&mut words)?;
                saw_device |= device.starts_with("vhost-user-test-device-pci,");
                out.extend(["-device".into(), device]);
            }
            _ => out.push(word.clone()),
        }
    }
    if !saw_device {
        return Err(Error::Scenario(
            "README: the command has no vhost-user-test-device-pci".into(),
        ));
    }
    out.extend(
        [
            "-accel", "tcg", "-display", "none", "-monitor", "stdio", "-serial", "none",
        ]
        .map(String::from),
    );
    Ok(out)
}

/// Runs `qemu` with `args` and waits (up to `timeout`) until `info pci` shows the vrdma
/// function with its BARs assigned by the firmware.
pub fn bring_up(qemu: &str, args: &[String], timeout: Duration) -> Result<DeviceSeen> {
    let mut child = Command::new(qemu)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Scenario(format!("starting {qemu}: {e}")))?;
    let outcome = poll_info_pci(&mut child, timeout);
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let (id, shm_bar_size) = outcome
        .map_err(|e| Error::Scenario(format!("{e}\n--- qemu stderr ---\n{}", stderr.trim_end())))?;
    let mut command = vec![qemu.to_owned()];
    command.extend(args.iter().cloned());
    Ok(DeviceSeen {
        id,
        shm_bar_size,
        command,
    })
}

fn poll_info_pci(
    child: &mut Child,
    timeout: Duration,
) -> std::result::Result<(String, u64), String> {
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        writeln!(stdin, "info pci").map_err(|e| format!("QEMU monitor: {e}"))?;
        // The monitor echoes no end marker for a command; a short quiet period ends the reply.
        let mut reply = String::new();
        while let Ok(line) = lines.recv_timeout(Duration::from_millis(500)) {
            reply.push_str(&line);
            reply.push('\n');
        }
        if let Some(found) = parse_info_pci(&reply) {
            return Ok(found);
        }
        if !reply.trim().is_empty() {
            last = reply;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!(
        "no vrdma function with an assigned shared-memory BAR within {timeout:?}; last `info pci`:\n{last}"
    ))
}

/// The vrdma function (1af4:1066 or 1af4:106a) in `info pci` output, with the size of its
/// BAR 4 once assigned.
pub fn parse_info_pci(text: &str) -> Option<(String, u64)> {
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(id) = ["1af4:1066", "1af4:106a"]
            .into_iter()
            .find(|id| line.ends_with(&format!("PCI device {id}")))
        else {
            continue;
        };
        for line in lines.by_ref() {
            if line.starts_with("id \"") || line.starts_with("Bus ") {
                break;
            }
            // "BAR4: 64 bit prefetchable memory at 0xf8000000 [0xfbffffff]"
            let Some(range) = line
                .strip_prefix("BAR4: 64 bit prefetchable memory at ")
                .map(|rest| rest.trim_end_matches('.'))
                .and_then(|rest| rest.strip_suffix(']'))
            else {
                continue;
            };
            let (start, end) = range.split_once(" [")?;
            let start = u64::from_str_radix(start.strip_prefix("0x")?, 16).ok()?;
            let end = u64::from_str_radix(end.strip_prefix("0x")?, 16).ok()?;
            return Some((id.to_owned(), end.checked_sub(start)? + 1));
        }
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_command_is_found_and_adapted() {
        let readme = include_str!("../../../README.md");
        let command = readme_command(readme).unwrap();
        assert_eq!(command[0], "qemu-system-x86_64");
        let args = adapt(&command, Path::new("/tmp/t.sock"), "512M").unwrap();
        let joined = args.join(" ");
        assert!(joined.contains("path=/tmp/t.sock"), "{joined}");
        assert!(joined.contains("virtio-id=38"), "{joined}");
        assert!(joined.contains("share=on"), "{joined}");
        assert!(
            !joined.contains("kvm") && !joined.contains("-drive"),
            "{joined}"
        );
    }

    #[test]
    fn a_missing_marker_or_device_is_an_error() {
        assert!(readme_command("no marker").is_err());
        let text = format!("{MARKER}\n```sh\nqemu-system-x86_64 -m 1G \\\n  -smp 2\n```\n");
        let command = readme_command(&text).unwrap();
        assert_eq!(command, ["qemu-system-x86_64", "-m", "1G", "-smp", "2"]);
        assert!(adapt(&command, Path::new("/s"), "1G").is_err());
    }

    #[test]
    fn info_pci_gives_the_device_and_its_shared_memory_bar() {
        let text = "\
  Bus  0, device   1, function 0:
    Class 1920: PCI device 1af4:1066
      PCI subsystem 1af4:1100
      IRQ 10, pin A
      BAR1: 32 bit memory at 0xfebd5000 [0xfebd5fff]
      BAR2: 64 bit prefetchable memory at 0xfd000000 [0xfd003fff]
      BAR4: 64 bit prefetchable memory at 0xf8000000 [0xfbffffff]
      id \"\"
";
        assert_eq!(
            parse_info_pci(text),
            Some(("1af4:1066".to_owned(), 64 << 20))
        );
        let unassigned = text.replace("at 0xf8000000 [0xfbffffff]", "(not mapped)");
        assert_eq!(parse_info_pci(&unassigned), None);
        assert_eq!(parse_info_pci("Class 0200: PCI device 8086:10d3"), None);
    }
}

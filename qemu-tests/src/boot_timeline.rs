//! Where a guest's boot went, from the kernel's log.
//!
//! The guest's uptime cannot tell: under nested TCG its clock runs on jiffies until the kernel
//! switches to the TSC late in boot, and timer ticks are lost until then (a nested guest's
//! init script read 5 s of uptime in a boot that had run for minutes). The log's timestamps come from the scheduler
//! clock, which reads the TSC from the start. So the init script and the suite each write a
//! marker into the log, and the timeline is read back from it: the kernel up to `/init`, the
//! initramfs up to the init script, the script up to the suite.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// The kernel's line when it starts the initramfs's `/init`.
const KERNEL_DONE: &str = "Run /init as init process";
/// The init script's marker (written by [`crate::vm`]'s script).
pub const SCRIPT_MARKER: &str = "vrdma-vm: the init script starts";
/// The suite's marker.
const SUITE_MARKER: &str = "vrdma-vm: the suite starts";

/// The phases of a boot in seconds, in order, ending when the suite started.
#[derive(Debug, Clone, PartialEq)]
pub struct BootTimeline {
    pub phases: Vec<(&'static str, f64)>,
}

/// Marks the suite's start in the kernel's log and reads the boot's timeline back; `None`
/// when the log cannot be read or lacks a marker (a boot without the init script's).
pub fn suite_starts() -> Option<BootTimeline> {
    // With its newline: the kernel holds a line without one back, as the start of a record.
    std::fs::write("/dev/kmsg", format!("{SUITE_MARKER}\n")).ok()?;
    let mut kmsg = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    // One record per read; EAGAIN after the last one.
    let mut records = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        match kmsg.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => records.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            // EPIPE: records overwritten before they were read; the next read goes on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    timeline(records.iter().map(String::as_str))
}

/// The timeline from `/dev/kmsg` records (`PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;TEXT`).
pub fn timeline<'a>(records: impl IntoIterator<Item = &'a str>) -> Option<BootTimeline> {
    let (mut kernel, mut script, mut suite) = (None, None, None);
    for record in records {
        let Some((header, text)) = record.split_once(';') else {
            continue;
        };
        let Some(usec) = header
            .split(',')
            .nth(2)
            .and_then(|field| field.parse::<u64>().ok())
        else {
            continue;
        };
        let secs = usec as f64 / 1e6;
        let text = text.lines().next().unwrap_or_default();
        if text.starts_with(KERNEL_DONE) {
            kernel = Some(secs);
        } else if text == SCRIPT_MARKER {
            script = Some(secs);
        } else if text == SUITE_MARKER {
            suite = Some(secs);
        }
    }
    let (kernel, script, suite) = (kernel?, script?, suite?);
    (kernel <= script && script <= suite).then(|| BootTimeline {
        phases: vec![
            ("boot: the kernel", kernel),
            ("boot: the initramfs", script - kernel),
            (
                "boot: the init script and the suite's start",
                suite - script,
            ),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phases_come_from_the_markers_timestamps() {
        let records = [
            "6,1,0,-;Linux version 7.3.4",
            "6,400,238700000,-;Run /init as init process",
            " with arguments:",
            "12,401,262500000,-;vrdma-vm: the init script starts",
            "4,402,300000000,-;virtio_console: something",
            "12,403,401000000,-;vrdma-vm: the suite starts\n",
        ];
        let t = timeline(records).unwrap();
        let names: Vec<_> = t.phases.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), 3);
        let secs: Vec<_> = t
            .phases
            .iter()
            .map(|(_, s)| (s * 10.0).round() / 10.0)
            .collect();
        assert_eq!(secs, [238.7, 23.8, 138.5]);
    }

    #[test]
    fn a_missing_marker_or_a_garbled_record_gives_no_timeline() {
        assert_eq!(timeline(["6,1,5,-;Run /init as init process"]), None);
        assert_eq!(
            timeline([
                "6,1,x,-;Run /init as init process",
                "12,2,10,-;vrdma-vm: the init script starts",
                "12,3,20,-;vrdma-vm: the suite starts",
            ]),
            None
        );
        assert_eq!(
            timeline([
                "6,1,30,-;Run /init as init process",
                "12,2,10,-;vrdma-vm: the init script starts",
                "12,3,20,-;vrdma-vm: the suite starts",
            ]),
            None,
            "out of order"
        );
    }
}

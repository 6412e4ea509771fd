//! The kernel's uncompressed ELF image (vmlinux), unpacked once from Debian's bzImage.
//!
//! QEMU boots such an image through its PVH entry point (the `XEN_ELFNOTE_PHYS32_ENTRY` note):
//! the kernel then does not decompress itself in the guest. Under nested TCG that saves part of
//! a boot: probe boots of the real-guest suite's guest took 107, 173 and 112 s from the ELF
//! against 156, 163 and 154 s from the bzImage (in the rxe VM; noisy).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::{IoContext, Result};

/// The zstd frame magic, little-endian on disk.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// ELF note type of the PVH 32-bit entry point, in the "Xen" note namespace.
const PVH_ENTRY_NOTE: u32 = 0x12;
const PT_NOTE: u32 = 4;

/// `N` bytes of `bytes` at `at`, if they are all there.
fn bytes_at<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    bytes_at(bytes, at).map(u16::from_le_bytes)
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes_at(bytes, at).map(u32::from_le_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<usize> {
    bytes_at(bytes, at).and_then(|b| usize::try_from(u64::from_le_bytes(b)).ok())
}

/// `len` bytes of `bytes` from `start`, if they are all there.
fn range(bytes: &[u8], start: usize, len: usize) -> Option<&[u8]> {
    bytes.get(start..start.checked_add(len)?)
}

/// The compressed kernel inside a bzImage (x86 boot protocol 2.08+: `payload_offset` and
/// `payload_length` of the setup header), or why there is none this module can unpack.
pub fn zstd_payload(bzimage: &[u8]) -> std::result::Result<&[u8], String> {
    if bzimage.get(0x202..0x206) != Some(b"HdrS") {
        return Err("no x86 boot protocol header".into());
    }
    let version = u16_at(bzimage, 0x206).unwrap_or(0);
    if version < 0x208 {
        return Err(format!("boot protocol {version:#x} has no payload fields"));
    }
    let setup_sectors = match bzimage[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let (offset, length) = u32_at(bzimage, 0x248)
        .zip(u32_at(bzimage, 0x24c))
        .ok_or("short header")?;
    let start = (setup_sectors + 1) * 512 + offset as usize;
    let payload =
        range(bzimage, start, length as usize).ok_or("payload past the end of the image")?;
    if payload.get(..4) != Some(&ZSTD_MAGIC[..]) {
        return Err("the payload is not zstd-compressed".into());
    }
    // The kernel's build appends the uncompressed size (4 bytes) after the zstd frame.
    Ok(&payload[..payload.len().saturating_sub(4)])
}

/// Whether `elf` is a 64-bit little-endian ELF with a PVH entry note (what QEMU's `-kernel`
/// needs to boot it).
pub fn has_pvh_entry(elf: &[u8]) -> bool {
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (u64_at(elf, 0x20), u16_at(elf, 0x36), u16_at(elf, 0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        let notes = || -> Option<&[u8]> {
            let header = phoff.checked_add(i * usize::from(phentsize))?;
            if u32_at(elf, header)? != PT_NOTE {
                return None;
            }
            range(elf, u64_at(elf, header + 8)?, u64_at(elf, header + 32)?)
        };
        notes().is_some_and(has_xen_note)
    })
}

/// Whether the notes in `notes` (a PT_NOTE segment) include Xen's PVH entry note.
fn has_xen_note(mut notes: &[u8]) -> bool {
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let word = |at: usize| u32_at(notes, at).unwrap_or(0);
        let (name_len, desc_len, kind) = (word(0) as usize, word(4) as usize, word(8));
        let name_end = 12 + align4(name_len);
        if notes.get(12..12 + name_len) == Some(b"Xen\0") && kind == PVH_ENTRY_NOTE {
            return true;
        }
        let Some(rest) = notes.get(name_end + align4(desc_len)..) else {
            return false;
        };
        notes = rest;
    }
    false
}

/// Unpacks `bzimage` into `out` (through a temporary file beside it, renamed into place) unless
/// `out` exists. Returns why not when the image is not one this can unpack into a PVH-bootable
/// ELF; the caller then boots the bzImage.
pub fn unpack_vmlinux(bzimage: &Path, out: &Path) -> Result<std::result::Result<(), String>> {
    if out.is_file() {
        return Ok(Ok(()));
    }
    let image = std::fs::read(bzimage).context(|| format!("reading {}", bzimage.display()))?;
    let payload = match zstd_payload(&image) {
        Ok(payload) => payload,
        Err(why) => return Ok(Err(why)),
    };
    let mut child = Command::new("zstd")
        .args(["-d", "-q", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context(|| "starting zstd".into())?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let elf = std::thread::scope(|scope| {
        let writer = scope.spawn(move || stdin.write_all(payload));
        let output = child.wait_with_output();
        let written = writer.join().expect("the writer does not panic");
        (output, written)
    });
    let output = elf.0.context(|| "running zstd".into())?;
    if !output.status.success() || elf.1.is_err() {
        return Ok(Err(format!(
            "zstd failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    if !has_pvh_entry(&output.stdout) {
        return Ok(Err("the unpacked kernel has no PVH entry note".into()));
    }
    let partial = out.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&partial, &output.stdout)
        .context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, out).context(|| format!("moving into {}", out.display()))?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bzImage header with a payload of `payload` after one setup sector.
    fn bzimage(version: u16, payload: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 2 * 512];
        image[0x1f1] = 1;
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&version.to_le_bytes());
        image[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        image[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        image.extend([0u8; 16]);
        image.extend(payload);
        image
    }

    #[test]
    fn finds_the_zstd_payload_without_its_size_trailer() {
        let payload = [&ZSTD_MAGIC[..], b"frame", &[1, 2, 3, 4]].concat();
        let image = bzimage(0x20f, &payload);
        assert_eq!(
            zstd_payload(&image).unwrap(),
            [&ZSTD_MAGIC[..], b"frame"].concat()
        );
    }

    #[test]
    fn refuses_what_it_cannot_unpack() {
        let payload = [&ZSTD_MAGIC[..], b"frame", &[0; 4]].concat();
        assert!(zstd_payload(&bzimage(0x206, &payload)).is_err());
        assert!(zstd_payload(&bzimage(0x20f, b"\xfd7zXZ\0 xz frame")).is_err());
        let mut truncated = bzimage(0x20f, &payload);
        truncated.truncate(truncated.len() - 1);
        assert!(zstd_payload(&truncated).is_err());
        assert!(zstd_payload(b"MZ not a kernel").is_err());
    }

    /// A 64-bit ELF whose only program header is a PT_NOTE segment holding `notes`.
    fn elf_with_notes(notes: &[u8]) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&PT_NOTE.to_le_bytes());
        elf[72..80].copy_from_slice(&120u64.to_le_bytes());
        elf[96..104].copy_from_slice(&(notes.len() as u64).to_le_bytes());
        elf.extend(notes);
        elf
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend((name.len() as u32).to_le_bytes());
        n.extend((desc.len() as u32).to_le_bytes());
        n.extend(kind.to_le_bytes());
        n.extend(name);
        n.resize(n.len().next_multiple_of(4), 0);
        n.extend(desc);
        n.resize(n.len().next_multiple_of(4), 0);
        n
    }

    #[test]
    fn sees_the_pvh_entry_note_after_other_notes() {
        let notes = [
            note(b"GNU\0", 3, &[0xab; 20]),
            note(b"Xen\0", 6, b"linux\0"),
            note(b"Xen\0", PVH_ENTRY_NOTE, &[0; 8]),
        ]
        .concat();
        assert!(has_pvh_entry(&elf_with_notes(&notes)));
    }

    #[test]
    fn an_elf_without_the_note_is_not_bootable_through_pvh() {
        let notes = [
            note(b"Xen\0", 6, b"linux\0"),
            note(b"GNU\0", PVH_ENTRY_NOTE, &[0; 8]),
        ]
        .concat();
        assert!(!has_pvh_entry(&elf_with_notes(&notes)));
        assert!(!has_pvh_entry(&elf_with_notes(&[])));
        assert!(!has_pvh_entry(b"\x7fELF\x01\x01 32-bit"));
        let mut cut = elf_with_notes(&note(b"Xen\0", PVH_ENTRY_NOTE, &[0; 8]));
        cut.truncate(cut.len() - 12);
        assert!(!has_pvh_entry(&cut));
    }
}

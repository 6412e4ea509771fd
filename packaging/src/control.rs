//! The package's control files: `control`, `conffiles`, `triggers` and the maintainer scripts.
//!
//! The scripts follow what Debian's helpers do for a service and a shared library, written
//! out because the package is assembled without debhelper: the `ldconfig` trigger refreshes
//! the loader's cache on installation and removal, `deb-systemd-helper` records the unit's
//! enablement (so a later `systemctl` choice survives upgrades), and the agent is started and
//! stopped only where systemd runs.

/// The fields of `DEBIAN/control`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub package: String,
    pub version: String,
    pub arch: String,
    /// Installed size in KiB.
    pub installed_kib: u64,
    pub depends: Vec<String>,
}

impl Control {
    /// The file's text.
    pub fn render(&self) -> String {
        format!(
            "Package: {}\n\
             Version: {}\n\
             Architecture: {}\n\
             Maintainer: vrdma maintainers <maintainers@vrdma.invalid>\n\
             Installed-Size: {}\n\
             Depends: {}\n\
             Suggests: ibverbs-utils, rdmacm-utils, perftest\n\
             Section: net\n\
             Priority: optional\n\
             Description: RDMA over a vrdma device for every program of a VM or container\n \
             vrdma is a paravirtual RDMA device: control verbs go to the host's\n \
             vrdma-backend, the data path maps the host NIC's queues directly.\n \
             .\n \
             This package makes unmodified programs linked against rdma-core's\n \
             libibverbs.so.1 and librdmacm.so.1 use vrdma (its drop-in libraries come\n \
             first in the loader's cache), and runs the guest agent vrdma-guestd, through\n \
             which members of the group rdma use the device without root.\n",
            self.package,
            self.version,
            self.arch,
            self.installed_kib,
            self.depends.join(", "),
        )
    }
}

/// What the maintainer scripts run that the ELF files do not tell: `groupadd` (postinst).
pub const SCRIPT_DEPENDS: &[&str] = &["passwd"];

/// `DEBIAN/triggers`: the loader's cache is rebuilt whenever this package comes or goes.
pub const TRIGGERS: &str = "activate-noawait ldconfig\n";

/// `DEBIAN/postinst`.
pub fn postinst(unit: &str) -> String {
    format!(
        r#"#!/bin/sh
set -e
UNIT={unit}
if [ "$1" = configure ]; then
    # Members of this group may use RDMA through the agent (its socket is root:rdma 0660).
    getent group rdma >/dev/null || groupadd --system rdma
    if command -v deb-systemd-helper >/dev/null; then
        # Enabled when first installed; an administrator's later choice is kept.
        if [ -z "$2" ] || deb-systemd-helper --quiet was-enabled "$UNIT"; then
            deb-systemd-helper enable "$UNIT" >/dev/null || true
        else
            deb-systemd-helper update-state "$UNIT" >/dev/null || true
        fi
    fi
fi
case "$1" in
configure|abort-upgrade|abort-deconfigure|abort-remove)
    # (Re)started with the new binary; after an aborted removal or upgrade, started again
    # (prerm stopped it). Running programs lose their sessions, as on any agent restart.
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        deb-systemd-invoke restart "$UNIT" >/dev/null || true
    fi
    ;;
esac
exit 0
"#
    )
}

/// `DEBIAN/prerm`.
pub fn prerm(unit: &str) -> String {
    format!(
        r#"#!/bin/sh
set -e
if [ -d /run/systemd/system ] && {{ [ "$1" = remove ] || [ "$1" = deconfigure ]; }}; then
    deb-systemd-invoke stop {unit} >/dev/null || true
fi
exit 0
"#
    )
}

/// `DEBIAN/postrm`. `socket` is the agent's: left behind, it would send every program using
/// rdma-core's libraries again to an agent that is gone.
pub fn postrm(unit: &str, socket: &str) -> String {
    format!(
        r#"#!/bin/sh
set -e
case "$1" in
remove|purge)
    rm -f {socket}
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
    fi
    ;;
esac
if [ "$1" = purge ] && command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper purge {unit} >/dev/null || true
fi
exit 0
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn the_control_file_has_one_field_per_line_and_a_folded_description() {
        let control = Control {
            package: "vrdma-guest".into(),
            version: "0.1.0".into(),
            arch: "amd64".into(),
            installed_kib: 12,
            depends: vec!["libc6 (>= 2.34)".into(), "libgcc-s1".into()],
        }
        .render();
        assert!(control.contains("\nDepends: libc6 (>= 2.34), libgcc-s1\n"));
        assert!(control.ends_with('\n'));
        // Every line is a field or a continuation (a space first), none is empty.
        for line in control.lines() {
            assert!(
                line.starts_with(' ') || line.split_once(": ").is_some(),
                "{line:?}"
            );
        }
    }

    #[test]
    fn the_maintainer_scripts_are_valid_shell() {
        for script in [
            postinst("vrdma-guestd.service"),
            prerm("vrdma-guestd.service"),
            postrm("vrdma-guestd.service", "/run/vrdma/agent.sock"),
        ] {
            assert!(script.starts_with("#!/bin/sh\nset -e\n"));
            let status = Command::new("sh")
                .args(["-n", "-c", &script])
                .status()
                .unwrap();
            assert!(status.success(), "{script}");
        }
    }
}

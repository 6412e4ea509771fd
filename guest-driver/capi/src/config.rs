//! What the environment selects: the process transport (with its guest-RAM size) when a
//! backend socket is named, else the guest agent when its socket is named or exists at the
//! default path, else the PCI transport (a vrdma PCI function of this guest).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vrdma::dma::PAGE_SIZE;
pub(crate) use vrdma::transport::agent::{AGENT_SOCKET_ENV, DEFAULT_AGENT_SOCKET};

/// Socket of a vrdma backend: selects the process transport.
pub(crate) const SOCKET_VAR: &str = "VRDMA_SOCKET";
/// Size of the process transport's memfd guest RAM (bytes, or with a K/M/G suffix).
pub(crate) const RAM_SIZE_VAR: &str = "VRDMA_RAM_SIZE";
/// PCI address (`dddd:bb:dd.f`) of the vrdma function to use, if there are several.
pub(crate) const PCI_ADDRESS_VAR: &str = "VRDMA_PCI_ADDRESS";
/// How long a port's GID table read from the device answers GID queries when no event made it
/// out of date, in milliseconds (`0`: every query reads the device); the staleness bound of
/// programs that never read events (see [`crate::gid_table`]).
pub(crate) const GID_CACHE_VAR: &str = "VRDMA_GID_CACHE_MS";
/// `0` turns the host kick off (spec §5.3): sends of the process transport then ring the
/// device's doorbell, as in a VM (for comparing the two paths).
pub(crate) const HOST_KICK_VAR: &str = "VRDMA_HOST_KICK";
/// `0` has the drop-in librdmacm move a connection's QP itself, a command per step, instead of
/// asking the device to (`VRDMA_F_CM_MOVES_QP`, spec §7.5; for comparing the two).
pub(crate) const CM_MOVES_QP_VAR: &str = "VRDMA_CM_MOVES_QP";
/// At most how many microseconds a control round trip polls for its answer before it sleeps
/// (`0`: never polls); see `vrdma::transport::DEFAULT_COMMAND_SPIN`.
pub(crate) const COMMAND_SPIN_VAR: &str = "VRDMA_COMMAND_SPIN_US";
/// Beyond this, polling would cost more than any command it could shorten.
const MAX_COMMAND_SPIN_US: u64 = 1_000_000;
/// Beyond this, a lifetime would make the cache's staleness bound meaningless.
const MAX_GID_CACHE_MS: u64 = 60_000;
/// Default guest-RAM size: application buffers registered with `ibv_reg_mr` live in it.
pub(crate) const DEFAULT_RAM_SIZE: usize = 1 << 30;

/// How to reach the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TransportChoice {
    /// Process transport: this process is the vhost-user frontend of the backend at `socket`.
    Process {
        socket: PathBuf,
        settings: ProcessSettings,
    },
    /// Agent transport: the guest agent (`vrdma-guestd`) at `socket` drives the device.
    Agent { socket: PathBuf },
    /// PCI transport: the vrdma PCI function at `address`, or the first one found;
    /// `command_spin` as in [`ProcessSettings`].
    Pci {
        address: Option<String>,
        command_spin: Duration,
    },
}

/// What the environment sets for the process transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcessSettings {
    /// Bytes of memfd guest RAM.
    pub(crate) ram_size: usize,
    /// Whether to accept `VRDMA_F_HOST_KICK` ([`HOST_KICK_VAR`]).
    pub(crate) host_kick: bool,
    /// Whether to accept `VRDMA_F_CM_MOVES_QP` ([`CM_MOVES_QP_VAR`]).
    pub(crate) cm_moves_qp: bool,
    /// How long a control round trip may poll ([`COMMAND_SPIN_VAR`]).
    pub(crate) command_spin: Duration,
}

impl Default for ProcessSettings {
    fn default() -> Self {
        ProcessSettings {
            ram_size: DEFAULT_RAM_SIZE,
            host_kick: true,
            cm_moves_qp: true,
            command_spin: vrdma::transport::DEFAULT_COMMAND_SPIN,
        }
    }
}

/// Why the environment selects no usable transport.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("{RAM_SIZE_VAR}={0:?} is not a size in bytes (K, M, G suffixes allowed) that is a non-zero multiple of 4 KiB")]
    RamSize(String),
    #[error("{GID_CACHE_VAR}={0:?} is not a number of milliseconds up to {MAX_GID_CACHE_MS}")]
    GidCacheLifetime(String),
    #[error(
        "{COMMAND_SPIN_VAR}={0:?} is not a number of microseconds up to {MAX_COMMAND_SPIN_US}"
    )]
    CommandSpin(String),
}

/// The GID cache lifetime the environment (read through `var`) sets, if it sets one.
pub(crate) fn gid_cache_lifetime(
    var: impl Fn(&str) -> Option<OsString>,
) -> Result<Option<Duration>, ConfigError> {
    let Some(text) = var(GID_CACHE_VAR) else {
        return Ok(None);
    };
    let text = text.to_string_lossy().into_owned();
    match text.trim().parse::<u64>() {
        Ok(ms) if ms <= MAX_GID_CACHE_MS => Ok(Some(Duration::from_millis(ms))),
        _ => Err(ConfigError::GidCacheLifetime(text)),
    }
}

/// How long control round trips may poll, as the environment (read through `var`) sets it.
fn command_spin(var: impl Fn(&str) -> Option<OsString>) -> Result<Duration, ConfigError> {
    let Some(text) = var(COMMAND_SPIN_VAR) else {
        return Ok(vrdma::transport::DEFAULT_COMMAND_SPIN);
    };
    let text = text.to_string_lossy().into_owned();
    match text.trim().parse::<u64>() {
        Ok(us) if us <= MAX_COMMAND_SPIN_US => Ok(Duration::from_micros(us)),
        _ => Err(ConfigError::CommandSpin(text)),
    }
}

/// Whether the environment (read through `var`) leaves the on/off feature `name` on (the
/// default: only `0` turns it off).
fn feature_on(var: impl Fn(&str) -> Option<OsString>, name: &str) -> bool {
    var(name).is_none_or(|value| value != "0")
}

/// The transport the environment (read through `var`) selects; `default_agent`: the agent's
/// default socket if it exists.
pub(crate) fn transport_choice(
    var: impl Fn(&str) -> Option<OsString>,
    default_agent: Option<PathBuf>,
) -> Result<TransportChoice, ConfigError> {
    let Some(socket) = var(SOCKET_VAR).filter(|s| !s.is_empty()) else {
        let agent = var(AGENT_SOCKET_ENV)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .or(default_agent);
        if let Some(socket) = agent {
            return Ok(TransportChoice::Agent { socket });
        }
        let address = var(PCI_ADDRESS_VAR)
            .filter(|s| !s.is_empty())
            .map(|s| s.to_string_lossy().into_owned());
        return Ok(TransportChoice::Pci {
            address,
            command_spin: command_spin(&var)?,
        });
    };
    let ram_size = match var(RAM_SIZE_VAR) {
        None => DEFAULT_RAM_SIZE,
        Some(text) => {
            let text = text.to_string_lossy().into_owned();
            parse_size(&text).ok_or(ConfigError::RamSize(text))?
        }
    };
    Ok(TransportChoice::Process {
        socket: socket.into(),
        settings: ProcessSettings {
            ram_size,
            host_kick: feature_on(&var, HOST_KICK_VAR),
            cm_moves_qp: feature_on(&var, CM_MOVES_QP_VAR),
            command_spin: command_spin(&var)?,
        },
    })
}

/// From the process environment.
pub(crate) fn from_env() -> Result<TransportChoice, ConfigError> {
    let default_agent = Path::new(DEFAULT_AGENT_SOCKET);
    let default_agent = default_agent.exists().then(|| default_agent.to_path_buf());
    transport_choice(|name| std::env::var_os(name), default_agent)
}

fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, shift) = match text.as_bytes().last()? {
        b'k' | b'K' => (&text[..text.len() - 1], 10),
        b'm' | b'M' => (&text[..text.len() - 1], 20),
        b'g' | b'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let size = digits.parse::<usize>().ok()?.checked_mul(1 << shift)?;
    (size != 0 && size.is_multiple_of(PAGE_SIZE)).then_some(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_socket_selects_the_process_transport() {
        assert_eq!(
            transport_choice(env(&[(SOCKET_VAR, "/tmp/v.sock")]), None),
            Ok(TransportChoice::Process {
                socket: "/tmp/v.sock".into(),
                settings: ProcessSettings::default()
            })
        );
        assert_eq!(
            transport_choice(env(&[(SOCKET_VAR, "/s"), (RAM_SIZE_VAR, "64M")]), None),
            Ok(TransportChoice::Process {
                socket: "/s".into(),
                settings: ProcessSettings {
                    ram_size: 64 << 20,
                    ..ProcessSettings::default()
                }
            })
        );
    }

    #[test]
    fn the_agent_is_chosen_by_name_or_by_its_default_socket() {
        assert_eq!(
            transport_choice(env(&[(AGENT_SOCKET_ENV, "/a.sock")]), None),
            Ok(TransportChoice::Agent {
                socket: "/a.sock".into()
            })
        );
        assert_eq!(
            transport_choice(env(&[]), Some("/run/x.sock".into())),
            Ok(TransportChoice::Agent {
                socket: "/run/x.sock".into()
            })
        );
        // A backend socket wins: the process is its own front-end then.
        assert_eq!(
            transport_choice(env(&[(SOCKET_VAR, "/s"), (AGENT_SOCKET_ENV, "/a")]), None),
            Ok(TransportChoice::Process {
                socket: "/s".into(),
                settings: ProcessSettings::default()
            })
        );
    }

    #[test]
    fn command_polling_has_a_default_and_a_bound() {
        let spin = |value: &str| command_spin(env(&[(COMMAND_SPIN_VAR, value)]));
        assert_eq!(
            command_spin(env(&[])),
            Ok(vrdma::transport::DEFAULT_COMMAND_SPIN)
        );
        assert_eq!(spin("0"), Ok(Duration::ZERO));
        assert_eq!(spin(" 250 "), Ok(Duration::from_micros(250)));
        for bad in ["-1", "1000001", "fast", ""] {
            assert_eq!(spin(bad), Err(ConfigError::CommandSpin(bad.into())));
        }
    }

    #[test]
    fn the_process_and_pci_transports_take_their_settings_from_the_environment() {
        assert_eq!(
            transport_choice(
                env(&[
                    (SOCKET_VAR, "/s"),
                    (HOST_KICK_VAR, "0"),
                    (CM_MOVES_QP_VAR, "0"),
                    (COMMAND_SPIN_VAR, "300")
                ]),
                None
            ),
            Ok(TransportChoice::Process {
                socket: "/s".into(),
                settings: ProcessSettings {
                    ram_size: DEFAULT_RAM_SIZE,
                    host_kick: false,
                    cm_moves_qp: false,
                    command_spin: Duration::from_micros(300)
                }
            })
        );
        assert_eq!(
            transport_choice(env(&[(COMMAND_SPIN_VAR, "40")]), None),
            Ok(TransportChoice::Pci {
                address: None,
                command_spin: Duration::from_micros(40)
            })
        );
        assert_eq!(
            transport_choice(env(&[(COMMAND_SPIN_VAR, "x")]), None),
            Err(ConfigError::CommandSpin("x".into()))
        );
    }

    #[test]
    fn on_off_features_are_on_unless_turned_off() {
        assert!(feature_on(env(&[]), HOST_KICK_VAR));
        assert!(feature_on(env(&[(HOST_KICK_VAR, "1")]), HOST_KICK_VAR));
        assert!(!feature_on(env(&[(HOST_KICK_VAR, "0")]), HOST_KICK_VAR));
        assert!(feature_on(env(&[(HOST_KICK_VAR, "0")]), CM_MOVES_QP_VAR));
        assert!(!feature_on(env(&[(CM_MOVES_QP_VAR, "0")]), CM_MOVES_QP_VAR));
    }

    #[test]
    fn without_a_socket_the_pci_transport_is_chosen() {
        assert_eq!(
            transport_choice(env(&[]), None),
            Ok(TransportChoice::Pci {
                address: None,
                command_spin: vrdma::transport::DEFAULT_COMMAND_SPIN
            })
        );
        assert_eq!(
            transport_choice(env(&[(SOCKET_VAR, ""), (PCI_ADDRESS_VAR, "00:03.0")]), None),
            Ok(TransportChoice::Pci {
                address: Some("00:03.0".into()),
                command_spin: vrdma::transport::DEFAULT_COMMAND_SPIN
            })
        );
    }

    #[test]
    fn the_gid_cache_lifetime_is_milliseconds_up_to_a_minute() {
        assert_eq!(gid_cache_lifetime(env(&[])), Ok(None));
        assert_eq!(
            gid_cache_lifetime(env(&[(GID_CACHE_VAR, "250")])),
            Ok(Some(Duration::from_millis(250)))
        );
        assert_eq!(
            gid_cache_lifetime(env(&[(GID_CACHE_VAR, "0")])),
            Ok(Some(Duration::ZERO))
        );
        for bad in ["", "-1", "1s", "60001"] {
            assert_eq!(
                gid_cache_lifetime(env(&[(GID_CACHE_VAR, bad)])),
                Err(ConfigError::GidCacheLifetime(bad.into()))
            );
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        for bad in ["0", "100", "1x", "", "99999999999999999999G"] {
            assert!(
                transport_choice(env(&[(SOCKET_VAR, "/s"), (RAM_SIZE_VAR, bad)]), None).is_err(),
                "{bad}"
            );
        }
        assert_eq!(parse_size("8k"), Some(8192));
        assert_eq!(parse_size("1G"), Some(1 << 30));
    }
}

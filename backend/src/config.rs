//! The daemon's configuration: one host device serving many named guests, each on its own
//! vhost-user socket with its own addresses, quotas and policy. It comes from a TOML file
//! (`--config`, format in `backend/README.md`, example in `backend/examples/guests.toml`) or,
//! for a single guest, from the command line; both end in a checked [`DaemonConfig`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::guest::options::DeviceOptions;
use crate::identity::provision::DEFAULT_GID_WAIT;
use crate::identity::GuestIdentity;

mod parse;
mod settings;

pub use parse::{parse_addresses, parse_prefixes, parse_size};
pub use settings::{GuestSettings, PolicySettings, QuotaSettings, Size, ValueList};

/// Longest accepted wait for an address's GID entries.
pub const MAX_GID_WAIT: Duration = Duration::from_secs(60);

/// One guest the daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestConfig {
    /// Its vhost-user socket.
    pub socket: PathBuf,
    /// Its device options (identity included); `host_port` is set once the device is known.
    pub options: DeviceOptions,
}

/// Everything the daemon serves, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Host RDMA device (default: the first with an ACTIVE port).
    pub device: Option<String>,
    /// Host port exposed to every guest (default: the device's first ACTIVE port).
    pub port: Option<u8>,
    /// Bound on the wait for a new address's GID entries.
    pub gid_wait: Duration,
    /// The guests, at least one; names, sockets and addresses are distinct.
    pub guests: Vec<GuestConfig>,
}

/// Why a configuration is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not have the expected shape.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A value is not acceptable.
    #[error("{place}: {message}")]
    Invalid {
        /// Where: the file and guest.
        place: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    device: Option<String>,
    port: Option<u8>,
    gid_wait_ms: Option<u64>,
    #[serde(default)]
    defaults: GuestSettings,
    #[serde(default, rename = "guest")]
    guests: Vec<RawGuest>,
}

/// One `[[guest]]` table: who the guest is and its settings. Read through a table because
/// serde cannot deny unknown keys through `#[serde(flatten)]`, and a misspelt key must be an
/// error, not a silently ignored limit: what is not the guest's name, socket or addresses
/// must be a setting.
#[derive(Debug)]
struct RawGuest {
    name: String,
    socket: PathBuf,
    addresses: Vec<String>,
    settings: GuestSettings,
}

impl<'de> Deserialize<'de> for RawGuest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(deserializer)?;
        let mut take = |key: &'static str| table.remove(key);
        let name = take("name").ok_or_else(|| D::Error::missing_field("name"))?;
        let socket = take("socket").ok_or_else(|| D::Error::missing_field("socket"))?;
        let addresses = take("addresses");
        Ok(RawGuest {
            name: name.try_into().map_err(D::Error::custom)?,
            socket: socket.try_into().map_err(D::Error::custom)?,
            addresses: addresses
                .map(toml::Value::try_into)
                .transpose()
                .map_err(D::Error::custom)?
                .unwrap_or_default(),
            settings: toml::Value::Table(table)
                .try_into()
                .map_err(D::Error::custom)?,
        })
    }
}

impl RawGuest {
    /// The guest's options: its own settings, else the file's defaults, else the daemon's.
    fn options(&self, defaults: &GuestSettings) -> Result<DeviceOptions, String> {
        let (options, policy) = self.settings.or(defaults).options()?;
        Ok(DeviceOptions {
            identity: GuestIdentity {
                name: self.name.clone(),
                addresses: parse_addresses(&self.addresses)?,
                policy,
            },
            ..options
        })
    }
}

impl DaemonConfig {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        DaemonConfig::parse(&text, path)
    }

    /// Parses and checks the text of a configuration file (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<DaemonConfig, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let file = path.display();
        let mut guests = Vec::with_capacity(raw.guests.len());
        for (i, guest) in raw.guests.iter().enumerate() {
            let options = guest
                .options(&raw.defaults)
                .map_err(|message| ConfigError::Invalid {
                    place: format!("{file}: guest {:?} (guest #{})", guest.name, i + 1),
                    message,
                })?;
            guests.push(GuestConfig {
                socket: guest.socket.clone(),
                options,
            });
        }
        let config = DaemonConfig {
            device: raw.device,
            port: raw.port,
            gid_wait: raw
                .gid_wait_ms
                .map_or(DEFAULT_GID_WAIT, Duration::from_millis),
            guests,
        };
        config
            .validate()
            .map_err(|(place, message)| ConfigError::Invalid {
                place: format!("{file}{place}"),
                message,
            })?;
        Ok(config)
    }

    /// Checks every guest's options and that guests share no name, socket or address.
    /// On error: where (`: guest "name"` or empty) and what.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.guests.is_empty() {
            return Err((String::new(), "no [[guest]] is configured".into()));
        }
        if self.gid_wait > MAX_GID_WAIT {
            return Err((
                String::new(),
                format!("gid_wait_ms {:?} is over {MAX_GID_WAIT:?}", self.gid_wait),
            ));
        }
        if self.port == Some(0) {
            return Err((String::new(), "port numbers start at 1".into()));
        }
        let mut names = HashMap::new();
        let mut sockets = HashMap::new();
        let mut owners = HashMap::new();
        for guest in &self.guests {
            let name = &guest.options.identity.name;
            let place = format!(": guest {name:?}");
            guest
                .options
                .validate()
                .map_err(|e| (place.clone(), e.to_string()))?;
            if names.insert(name.clone(), ()).is_some() {
                return Err((place, "this name is used by an earlier guest".into()));
            }
            if let Some(other) = sockets.insert(guest.socket.clone(), name.clone()) {
                return Err((
                    place,
                    format!("socket {} is guest {other:?}'s too", guest.socket.display()),
                ));
            }
            for address in &guest.options.identity.addresses {
                if let Some(other) = owners.insert(address.ip, name.clone()) {
                    return Err((
                        place,
                        format!("address {} belongs to guest {other:?} already", address.ip),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::options::StagedRings;
    use crate::resources::quotas::Quotas;

    fn parse(text: &str) -> Result<DaemonConfig, String> {
        DaemonConfig::parse(text, Path::new("guests.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("8k"), Ok(8192));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn the_example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/guests.toml");
        let config = DaemonConfig::load(&path).unwrap();
        assert_eq!(config.guests.len(), 3);
        let a = &config.guests[0].options;
        assert_eq!(a.identity.name, "tenant-a");
        assert_eq!(a.identity.addresses.len(), 2);
        assert!(config
            .guests
            .iter()
            .any(|g| !g.options.identity.has_addresses()));
    }

    #[test]
    fn a_full_guest_is_read() {
        let config = parse(
            r#"
            device = "rxe0"
            port = 1
            gid_wait_ms = 2500

            [[guest]]
            name = "a"
            socket = "/run/vrdma/a.sock"
            addresses = ["fd00::a:1/64", "192.0.2.10"]
            shm_size = "32M"
            max_mr_pages = 1024
            allow_ud = true
            doorbell_poll_us = 50
            staged_rings = "always"
            staged_cqs = "never"
            quotas = { qps = 8, mr_bytes = "1G", ahs = 4 }
            policy = { traffic_classes = "0,96-97", service_levels = [0, 3], destinations = ["fd00::/64"] }

            [[guest]]
            name = "b"
            socket = "/run/vrdma/b.sock"
            "#,
        )
        .unwrap();
        assert_eq!(config.device.as_deref(), Some("rxe0"));
        assert_eq!(config.port, Some(1));
        assert_eq!(config.gid_wait, Duration::from_millis(2500));
        let a = &config.guests[0].options;
        assert_eq!(a.shm_size, 32 << 20);
        assert_eq!(a.max_mr_pages, 1024);
        assert!(a.allow_ud && !a.allow_memory_windows);
        assert_eq!(a.doorbell_poll, Duration::from_micros(50));
        assert_eq!(a.staged_rings, StagedRings::Always);
        assert_eq!(a.staged_cqs, StagedRings::Never);
        assert_eq!(
            (a.quotas.qps, a.quotas.mr_bytes, a.quotas.ahs),
            (8, 1 << 30, 4)
        );
        assert_eq!(a.quotas.pds, Quotas::default().pds);
        let policy = &a.identity.policy;
        assert!(policy.traffic_classes.contains(97) && !policy.traffic_classes.contains(1));
        assert!(policy.service_levels.contains(3) && !policy.service_levels.contains(1));
        assert_eq!(policy.destinations.as_ref().unwrap().len(), 1);
        assert_eq!(a.identity.addresses[1].to_string(), "192.0.2.10/32");
        let b = &config.guests[1].options;
        assert_eq!(
            *b,
            DeviceOptions {
                identity: GuestIdentity {
                    name: "b".into(),
                    ..GuestIdentity::default()
                },
                ..DeviceOptions::default()
            }
        );
        assert_eq!(config.guests[1].socket, Path::new("/run/vrdma/b.sock"));
    }

    #[test]
    fn defaults_apply_key_by_key() {
        let config = parse(
            r#"
            [defaults]
            allow_ud = true
            quotas = { qps = 16, mr_bytes = "2G" }
            policy = { service_levels = "0-1", destinations = ["fd00::/16"] }

            [[guest]]
            name = "a"
            socket = "/a"
            quotas = { qps = 4 }
            policy = { destinations = ["fd00:a::/32"] }

            [[guest]]
            name = "b"
            socket = "/b"
            allow_ud = false
            "#,
        )
        .unwrap();
        let (a, b) = (&config.guests[0].options, &config.guests[1].options);
        assert_eq!((a.quotas.qps, a.quotas.mr_bytes), (4, 2 << 30));
        assert_eq!((b.quotas.qps, b.quotas.mr_bytes), (16, 2 << 30));
        assert!(a.allow_ud && !b.allow_ud);
        assert!(!a.identity.policy.service_levels.contains(2));
        let dest = |o: &DeviceOptions| o.identity.policy.destinations.clone().unwrap();
        assert_eq!(dest(a), vec!["fd00:a::/32".parse().unwrap()]);
        assert_eq!(dest(b), vec!["fd00::/16".parse().unwrap()]);
        assert!(parse("[defaults]\nname = \"x\"\n")
            .unwrap_err()
            .contains("unknown field `name`"));
    }

    #[test]
    fn bad_files_say_what_and_where() {
        let guest = |body: &str| format!("[[guest]]\nname = \"a\"\nsocket = \"/a\"\n{body}\n");
        let cases: &[(String, &str)] = &[
            ("".into(), "guests.toml: no [[guest]] is configured"),
            (
                "[[guest]\n".into(),
                "guests.toml: TOML parse error at line 1",
            ),
            (guest("colour = 1"), "unknown field `colour`"),
            ("[[guest]]\nname = \"a\"\n".into(), "missing field `socket`"),
            (
                guest("addresses = [\"fe80::zz\"]"),
                "guests.toml: guest \"a\" (guest #1): address: \"fe80::zz\" is not an IPv6",
            ),
            (
                guest("addresses = [\"::1\"]"),
                "address: ::1 cannot be a guest's RDMA address",
            ),
            (
                guest("policy = { service_levels = [16] }"),
                "policy.service_levels 16 is out of range 0..=15",
            ),
            (
                guest("policy = { destinations = [\"10.0.0.0/40\"] }"),
                "destination prefix: prefix length 40 of \"10.0.0.0/40\" is over 32",
            ),
            (
                guest("quotas = { mr_bytes = \"lots\" }"),
                "quotas.mr_bytes: \"lots\"",
            ),
            (
                guest("shm_size = 12345"),
                "guests.toml: guest \"a\": queue region size 0x3039 must be a power of two",
            ),
            (
                format!("{}{}", guest(""), guest("")),
                "guests.toml: guest \"a\": this name is used by an earlier guest",
            ),
            (
                format!("{}[[guest]]\nname = \"b\"\nsocket = \"/a\"\n", guest("")),
                "guests.toml: guest \"b\": socket /a is guest \"a\"'s too",
            ),
            (
                format!(
                    "{}[[guest]]\nname = \"b\"\nsocket = \"/b\"\naddresses = [\"fd00::1/64\"]\n",
                    guest("addresses = [\"fd00::1\"]")
                ),
                "guests.toml: guest \"b\": address fd00::1 belongs to guest \"a\" already",
            ),
            (
                guest("name2 = 1").replace("name = \"a\"", "name = \"a b\""),
                "unknown field `name2`",
            ),
            (
                guest("").replace("name = \"a\"", "name = \"a b\""),
                "guest identity: guest name \"a b\" must be",
            ),
            (
                format!("gid_wait_ms = 600000\n{}", guest("")),
                "gid_wait_ms 600s is over 60s",
            ),
        ];
        for (text, expected) in cases {
            let error = parse(text).unwrap_err();
            assert!(
                error.contains(expected),
                "{text:?}:\n  {error}\n  wanted {expected:?}"
            );
        }
        let missing = DaemonConfig::load(Path::new("/nonexistent/guests.toml")).unwrap_err();
        assert!(missing
            .to_string()
            .starts_with("cannot read /nonexistent/guests.toml: "));
    }
}

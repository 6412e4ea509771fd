//! The daemon's configuration: one host device serving many named guests, each on its own
//! vhost-user socket with its own addresses, quotas and policy. It comes from a TOML file
//! (`--config`, format in `backend/README.md`, example in `backend/examples/guests.toml`) or,
//! for a single guest, from the command line; both end in a checked [`DaemonConfig`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::guest::options::{DeviceOptions, StagedRings};
use crate::identity::policy::{parse_value_list, ValueSet, MAX_SERVICE_LEVEL, MAX_TRAFFIC_CLASS};
use crate::identity::provision::DEFAULT_GID_WAIT;
use crate::identity::{GuestAddress, GuestIdentity, IpPrefix, TrafficPolicy};
use crate::resources::quotas::Quotas;

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

/// Parses a byte count with an optional binary suffix (K, M, G).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        _ => (text, 0),
    };
    let value: u64 = digits
        .parse()
        .map_err(|e| format!("{text:?} is not a byte count: {e}"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A byte count: a number, or a string with a K/M/G suffix.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self) -> Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(text) => parse_size(text),
        }
    }
}

/// A set of small values: a list of numbers, or a string such as `"0,96-103"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ValueList {
    Values(Vec<u32>),
    Text(String),
}

impl ValueList {
    fn set(&self, max: u8, what: &'static str) -> Result<ValueSet, String> {
        match self {
            ValueList::Values(values) => {
                ValueSet::of(values.iter().copied(), max, what).map_err(|e| e.to_string())
            }
            ValueList::Text(text) => parse_value_list(text, max, what),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    device: Option<String>,
    port: Option<u8>,
    gid_wait_ms: Option<u64>,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default, rename = "guest")]
    guests: Vec<RawGuest>,
}

/// What every guest gets unless it says otherwise: a guest's own setting replaces the
/// default one key by key (a guest's `policy.destinations` replaces the default list).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    shm_size: Option<Size>,
    max_mr_pages: Option<u32>,
    max_mr_mappings: Option<u32>,
    allow_ud: Option<bool>,
    allow_unenforced_ud: Option<bool>,
    allow_memory_windows: Option<bool>,
    doorbell_poll_us: Option<u64>,
    staged_rings: Option<StagedRings>,
    staged_cqs: Option<StagedRings>,
    #[serde(default)]
    quotas: RawQuotas,
    #[serde(default)]
    policy: RawPolicy,
}

/// One `[[guest]]` table. Its settings repeat [`RawDefaults`]' on purpose: serde cannot deny
/// unknown keys through `#[serde(flatten)]`, and a misspelt key must be an error, not a
/// silently ignored limit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGuest {
    name: String,
    socket: PathBuf,
    #[serde(default)]
    addresses: Vec<String>,
    shm_size: Option<Size>,
    max_mr_pages: Option<u32>,
    max_mr_mappings: Option<u32>,
    allow_ud: Option<bool>,
    allow_unenforced_ud: Option<bool>,
    allow_memory_windows: Option<bool>,
    doorbell_poll_us: Option<u64>,
    staged_rings: Option<StagedRings>,
    staged_cqs: Option<StagedRings>,
    #[serde(default)]
    quotas: RawQuotas,
    #[serde(default)]
    policy: RawPolicy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuotas {
    pds: Option<u32>,
    mrs: Option<u32>,
    mr_bytes: Option<Size>,
    mappings: Option<u32>,
    cqs: Option<u32>,
    qps: Option<u32>,
    srqs: Option<u32>,
    ahs: Option<u32>,
    mws: Option<u32>,
    cm_ids: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    traffic_classes: Option<ValueList>,
    service_levels: Option<ValueList>,
    destinations: Option<Vec<String>>,
}

/// Parses every address of a list, naming the bad one.
pub fn parse_addresses<S: AsRef<str>>(texts: &[S]) -> Result<Vec<GuestAddress>, String> {
    texts
        .iter()
        .map(|t| t.as_ref().parse().map_err(|e| format!("address: {e}")))
        .collect()
}

/// Parses every destination prefix of a list, naming the bad one.
pub fn parse_prefixes<S: AsRef<str>>(texts: &[S]) -> Result<Vec<IpPrefix>, String> {
    texts
        .iter()
        .map(|t| {
            t.as_ref()
                .parse()
                .map_err(|e| format!("destination prefix: {e}"))
        })
        .collect()
}

impl RawGuest {
    fn options(&self, d: &RawDefaults) -> Result<DeviceOptions, String> {
        let defaults = DeviceOptions::default();
        let q = Quotas::default();
        let (raw, rd) = (&self.quotas, &d.quotas);
        let size = |s: Option<&Size>, default: u64, what: &str| {
            s.map_or(Ok(default), Size::bytes)
                .map_err(|e| format!("{what}: {e}"))
        };
        let quotas = Quotas {
            pds: raw.pds.or(rd.pds).unwrap_or(q.pds),
            mrs: raw.mrs.or(rd.mrs).unwrap_or(q.mrs),
            mr_bytes: size(
                raw.mr_bytes.as_ref().or(rd.mr_bytes.as_ref()),
                q.mr_bytes,
                "quotas.mr_bytes",
            )?,
            mappings: raw.mappings.or(rd.mappings).unwrap_or(q.mappings),
            cqs: raw.cqs.or(rd.cqs).unwrap_or(q.cqs),
            qps: raw.qps.or(rd.qps).unwrap_or(q.qps),
            srqs: raw.srqs.or(rd.srqs).unwrap_or(q.srqs),
            ahs: raw.ahs.or(rd.ahs).unwrap_or(q.ahs),
            mws: raw.mws.or(rd.mws).unwrap_or(q.mws),
            cm_ids: raw.cm_ids.or(rd.cm_ids).unwrap_or(q.cm_ids),
        };
        let (p, pd) = (&self.policy, &d.policy);
        let open = TrafficPolicy::default();
        let policy = TrafficPolicy {
            traffic_classes: p
                .traffic_classes
                .as_ref()
                .or(pd.traffic_classes.as_ref())
                .map_or(Ok(open.traffic_classes), |l| {
                    l.set(MAX_TRAFFIC_CLASS, "policy.traffic_classes")
                })?,
            service_levels: p
                .service_levels
                .as_ref()
                .or(pd.service_levels.as_ref())
                .map_or(Ok(open.service_levels), |l| {
                    l.set(MAX_SERVICE_LEVEL, "policy.service_levels")
                })?,
            destinations: p
                .destinations
                .as_deref()
                .or(pd.destinations.as_deref())
                .map(parse_prefixes)
                .transpose()?,
        };
        Ok(DeviceOptions {
            quotas,
            shm_size: size(
                self.shm_size.as_ref().or(d.shm_size.as_ref()),
                defaults.shm_size,
                "shm_size",
            )?,
            allow_ud: self.allow_ud.or(d.allow_ud).unwrap_or(defaults.allow_ud),
            allow_unenforced_ud: self
                .allow_unenforced_ud
                .or(d.allow_unenforced_ud)
                .unwrap_or(defaults.allow_unenforced_ud),
            max_mr_mappings: self
                .max_mr_mappings
                .or(d.max_mr_mappings)
                .unwrap_or(defaults.max_mr_mappings),
            allow_memory_windows: self
                .allow_memory_windows
                .or(d.allow_memory_windows)
                .unwrap_or(defaults.allow_memory_windows),
            max_mr_pages: self
                .max_mr_pages
                .or(d.max_mr_pages)
                .unwrap_or(defaults.max_mr_pages),
            doorbell_poll: self
                .doorbell_poll_us
                .or(d.doorbell_poll_us)
                .map_or(defaults.doorbell_poll, Duration::from_micros),
            staged_rings: self
                .staged_rings
                .or(d.staged_rings)
                .unwrap_or(defaults.staged_rings),
            staged_cqs: self
                .staged_cqs
                .or(d.staged_cqs)
                .unwrap_or(defaults.staged_cqs),
            identity: GuestIdentity {
                name: self.name.clone(),
                addresses: parse_addresses(&self.addresses)?,
                policy,
            },
            ..defaults
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

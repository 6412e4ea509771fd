//! A guest's settings, defined once for both of their sources: the command line (flattened
//! into the daemon's `Args`: `--max-qps`, `--traffic-classes`…) and a configuration file's
//! `[defaults]` and `[[guest]]` tables (keys named as the fields: `quotas.qps`,
//! `policy.traffic_classes`…). Every setting is optional: an unset one takes the value of the
//! next source ([`GuestSettings::or`]), and in the end the default ([`GuestSettings::options`]).

use std::time::Duration;

use serde::Deserialize;

use super::parse::{parse_prefixes, parse_size};
use crate::guest::options::{DeviceOptions, StagedRings};
use crate::identity::policy::{parse_value_list, ValueSet, MAX_SERVICE_LEVEL, MAX_TRAFFIC_CLASS};
use crate::identity::TrafficPolicy;
use crate::resources::quotas::Quotas;

/// A byte count: a number, or a string with a K/M/G suffix.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Size {
    /// A number of bytes.
    Bytes(u64),
    /// A number with an optional binary suffix, checked when the options are made.
    Text(String),
}

impl Size {
    /// The byte count.
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(text) => parse_size(text),
        }
    }

    /// A command-line value (checked at once).
    fn parse_arg(text: &str) -> Result<Size, String> {
        parse_size(text).map(Size::Bytes)
    }
}

/// A set of small values: a list of numbers, or a string such as `"0,96-103"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ValueList {
    /// The values.
    Values(Vec<u32>),
    /// Values and ranges, comma-separated.
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

    /// A command-line value (checked when the options are made, against its range).
    fn parse_arg(text: &str) -> Result<ValueList, String> {
        Ok(ValueList::Text(text.to_string()))
    }
}

/// What a guest may hold (spec §10); unset: [`Quotas::default`].
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct QuotaSettings {
    /// Most PDs per guest (default 64).
    #[arg(long = "max-pds")]
    pub pds: Option<u32>,
    /// Most MRs per guest (default 4096).
    #[arg(long = "max-mrs")]
    pub mrs: Option<u32>,
    /// Most bytes of all MRs of a guest together (suffixes K, M, G; default 16G).
    #[arg(long = "max-mr-bytes", value_parser = Size::parse_arg)]
    pub mr_bytes: Option<Size>,
    /// Most memory mappings of all MR windows and staged queues of a guest together: a window
    /// needs one per run of pages contiguous in guest RAM, a staged queue one (default 16384).
    #[arg(long = "max-guest-mappings")]
    pub mappings: Option<u32>,
    /// Most CQs per guest (default 4096).
    #[arg(long = "max-cqs")]
    pub cqs: Option<u32>,
    /// Most QPs per guest (default 4096).
    #[arg(long = "max-qps")]
    pub qps: Option<u32>,
    /// Most SRQs per guest (default 256).
    #[arg(long = "max-srqs")]
    pub srqs: Option<u32>,
    /// Most address handles per guest (default 4096).
    #[arg(long = "max-ahs")]
    pub ahs: Option<u32>,
    /// Most memory windows per guest (with --allow-memory-windows; default 4096).
    #[arg(long = "max-mws")]
    pub mws: Option<u32>,
    /// Most connection-manager ids per guest (connect requests waiting for an answer
    /// included; default 4096).
    #[arg(long = "max-cm-ids")]
    pub cm_ids: Option<u32>,
}

/// Which paths a guest's address vectors may take (spec §12); unset: anything.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    /// Traffic classes the guest's address vectors may carry, e.g. `0,96-103` (default: all).
    #[arg(long = "traffic-classes", value_name = "LIST", value_parser = ValueList::parse_arg)]
    pub traffic_classes: Option<ValueList>,
    /// Service levels the guest's address vectors may carry, e.g. `0-3` (default: all).
    #[arg(long = "service-levels", value_name = "LIST", value_parser = ValueList::parse_arg)]
    pub service_levels: Option<ValueList>,
    /// A destination prefix the guest may reach (e.g. `fd00::/48`, `10.1.0.0/16`; repeat for
    /// more). Without any, every destination is allowed.
    #[arg(long = "allow-destination", value_name = "PREFIX")]
    pub destinations: Option<Vec<String>>,
}

/// A guest's settings (see the module's documentation).
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct GuestSettings {
    /// Size of each guest's queue region in bytes (power of two; suffixes K, M, G; default
    /// 64M).
    #[arg(long, value_parser = Size::parse_arg)]
    pub shm_size: Option<Size>,
    /// Largest number of pages one memory registration may name (default 65536).
    #[arg(long)]
    pub max_mr_pages: Option<u32>,
    /// Most memory mappings of one MR's window; a REG_MR needing more is refused (default
    /// 8192).
    #[arg(long)]
    pub max_mr_mappings: Option<u32>,
    /// Offer unreliable-datagram QPs and address handles. UD sends go through a staging ring
    /// that the daemon checks (VRDMA_F_UD_STAGED_SQ, spec §9.6): a guest sends only through
    /// its own address handles.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allow_ud: Option<bool>,
    /// With --allow-ud, also accept UD QPs of drivers that did not negotiate
    /// VRDMA_F_UD_STAGED_SQ. Their UD sends are not checked: on rxe such a guest can choose the
    /// source and destination addresses of its packets (spec §12). Only for trusted guests.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL", requires = "allow_ud")]
    pub allow_unenforced_ud: Option<bool>,
    /// Offer memory windows (ALLOC_MW, MW_BIND access, bind and invalidate work requests).
    /// rxe checks neither the MR of a bind nor the window of an invalidate against the
    /// binding QP's PD, so guests that all have this can reach each other's MRs that were
    /// registered with MW_BIND access (spec §12): only for guests that trust each other.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allow_memory_windows: Option<bool>,
    /// After a doorbell, keep polling the guest's doorbell area for this many microseconds
    /// (restarted by every doorbell found, at most 8 windows per notification) while telling
    /// the guest not to notify (VRDMA_F_DOORBELL_POLL, spec §5.3); 0 turns polling off
    /// (default 0).
    #[arg(long)]
    pub doorbell_poll_us: Option<u64>,
    /// When RC and UC QPs post through staging rings that the daemon copies to the host
    /// queues (VRDMA_F_STAGED_RINGS, spec §9.7): `auto` once QEMU could not take another
    /// queue mapping (so a guest gets thousands of QPs, not a few hundred), `always`, or
    /// `never` (past QEMU's mappings CREATE_QP fails with QUOTA). Default `auto`.
    #[arg(long, value_enum)]
    pub staged_rings: Option<StagedRings>,
    /// When CQs get staging rings that the daemon copies the host's completions into
    /// (VRDMA_F_STAGED_CQS, spec §9.8; a wake-up of the daemon per completion event): `auto`
    /// once QEMU's mappings are nearly all taken (so a guest gets thousands of CQs), `always`,
    /// or `never` (past QEMU's mappings CREATE_CQ fails with QUOTA). Default `auto`.
    #[arg(long, value_enum)]
    pub staged_cqs: Option<StagedRings>,
    /// The guest's quotas.
    #[command(flatten)]
    #[serde(default)]
    pub quotas: QuotaSettings,
    /// The guest's traffic policy.
    #[command(flatten)]
    #[serde(default)]
    pub policy: PolicySettings,
}

impl GuestSettings {
    /// These settings, each unset one taken from `fallback`.
    pub fn or(&self, fallback: &GuestSettings) -> GuestSettings {
        let (q, fq) = (&self.quotas, &fallback.quotas);
        let (p, fp) = (&self.policy, &fallback.policy);
        GuestSettings {
            shm_size: self.shm_size.clone().or(fallback.shm_size.clone()),
            max_mr_pages: self.max_mr_pages.or(fallback.max_mr_pages),
            max_mr_mappings: self.max_mr_mappings.or(fallback.max_mr_mappings),
            allow_ud: self.allow_ud.or(fallback.allow_ud),
            allow_unenforced_ud: self.allow_unenforced_ud.or(fallback.allow_unenforced_ud),
            allow_memory_windows: self.allow_memory_windows.or(fallback.allow_memory_windows),
            doorbell_poll_us: self.doorbell_poll_us.or(fallback.doorbell_poll_us),
            staged_rings: self.staged_rings.or(fallback.staged_rings),
            staged_cqs: self.staged_cqs.or(fallback.staged_cqs),
            quotas: QuotaSettings {
                pds: q.pds.or(fq.pds),
                mrs: q.mrs.or(fq.mrs),
                mr_bytes: q.mr_bytes.clone().or(fq.mr_bytes.clone()),
                mappings: q.mappings.or(fq.mappings),
                cqs: q.cqs.or(fq.cqs),
                qps: q.qps.or(fq.qps),
                srqs: q.srqs.or(fq.srqs),
                ahs: q.ahs.or(fq.ahs),
                mws: q.mws.or(fq.mws),
                cm_ids: q.cm_ids.or(fq.cm_ids),
            },
            policy: PolicySettings {
                traffic_classes: p.traffic_classes.clone().or(fp.traffic_classes.clone()),
                service_levels: p.service_levels.clone().or(fp.service_levels.clone()),
                destinations: p.destinations.clone().or(fp.destinations.clone()),
            },
        }
    }

    /// The device options these settings give (unset ones: the defaults), and the guest's
    /// traffic policy. On error: which setting and why.
    pub fn options(&self) -> Result<(DeviceOptions, TrafficPolicy), String> {
        let defaults = DeviceOptions::default();
        let q = Quotas::default();
        let size = |s: Option<&Size>, default: u64, what: &str| {
            s.map_or(Ok(default), Size::bytes)
                .map_err(|e| format!("{what}: {e}"))
        };
        let raw = &self.quotas;
        let quotas = Quotas {
            pds: raw.pds.unwrap_or(q.pds),
            mrs: raw.mrs.unwrap_or(q.mrs),
            mr_bytes: size(raw.mr_bytes.as_ref(), q.mr_bytes, "quotas.mr_bytes")?,
            mappings: raw.mappings.unwrap_or(q.mappings),
            cqs: raw.cqs.unwrap_or(q.cqs),
            qps: raw.qps.unwrap_or(q.qps),
            srqs: raw.srqs.unwrap_or(q.srqs),
            ahs: raw.ahs.unwrap_or(q.ahs),
            mws: raw.mws.unwrap_or(q.mws),
            cm_ids: raw.cm_ids.unwrap_or(q.cm_ids),
        };
        let open = TrafficPolicy::default();
        let p = &self.policy;
        let policy = TrafficPolicy {
            traffic_classes: p
                .traffic_classes
                .as_ref()
                .map_or(Ok(open.traffic_classes), |l| {
                    l.set(MAX_TRAFFIC_CLASS, "policy.traffic_classes")
                })?,
            service_levels: p
                .service_levels
                .as_ref()
                .map_or(Ok(open.service_levels), |l| {
                    l.set(MAX_SERVICE_LEVEL, "policy.service_levels")
                })?,
            destinations: p.destinations.as_deref().map(parse_prefixes).transpose()?,
        };
        let options = DeviceOptions {
            quotas,
            shm_size: size(self.shm_size.as_ref(), defaults.shm_size, "shm_size")?,
            allow_ud: self.allow_ud.unwrap_or(defaults.allow_ud),
            allow_unenforced_ud: self
                .allow_unenforced_ud
                .unwrap_or(defaults.allow_unenforced_ud),
            allow_memory_windows: self
                .allow_memory_windows
                .unwrap_or(defaults.allow_memory_windows),
            max_mr_pages: self.max_mr_pages.unwrap_or(defaults.max_mr_pages),
            max_mr_mappings: self.max_mr_mappings.unwrap_or(defaults.max_mr_mappings),
            doorbell_poll: self
                .doorbell_poll_us
                .map_or(defaults.doorbell_poll, Duration::from_micros),
            staged_rings: self.staged_rings.unwrap_or(defaults.staged_rings),
            staged_cqs: self.staged_cqs.unwrap_or(defaults.staged_cqs),
            ..defaults
        };
        Ok((options, policy))
    }
}

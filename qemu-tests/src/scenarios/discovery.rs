//! Discovery: UCX finds the device the way it finds any RDMA device, through the files the
//! guest agent publishes (`vrdma-guestd --publish`, spec §7.6), natively first.
//!
//! In process mode the agent writes them into a directory, and a container runtime
//! bind-mounts it at `/sys/class/infiniband` and `/dev/infiniband/vrdma0`; the scenario does
//! what the runtime does, in a mount namespace of its own, and runs unmodified `ucx_info -d`
//! there as `nobody` over the drop-in and the agent. In VM mode the agent publishes at those
//! paths itself (the real-guest suite checks it there).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::{Proc, DEVICE, NOBODY};
use crate::perftest::DROPIN_DEVICE as VRDMA_DEVICE;
use crate::vm::shell_quote;

/// The UCX transports a verbs device must offer.
pub const VERBS_TRANSPORTS: &[&str] = &["rc_verbs", "ud_verbs"];

/// Where `vrdma-guestd --publish DIR` puts the node.
pub fn published_node(dir: &Path) -> PathBuf {
    dir.join("dev/infiniband").join(VRDMA_DEVICE)
}

/// What UCX listed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UcxListing {
    /// `(transport, device)` pairs on rxe0 natively.
    pub native: Vec<(String, String)>,
    /// The same over vrdma.
    pub vrdma: Vec<(String, String)>,
}

/// The `(transport, device)` pairs of `ucx_info -d`'s output.
pub fn ucx_devices(output: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut transport = None;
    for line in output.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(name) = line.strip_prefix("Transport:") {
            transport = Some(name.trim().to_string());
        } else if let Some(device) = line.strip_prefix("Device:") {
            if let Some(transport) = &transport {
                pairs.push((transport.clone(), device.trim().to_string()));
            }
        }
    }
    pairs
}

/// Whether `pairs` list every verbs transport on `device` port 1; the first missing one if not.
fn verbs_transports_on(pairs: &[(String, String)], device: &str) -> Result<(), &'static str> {
    let port = format!("{device}:1");
    match VERBS_TRANSPORTS
        .iter()
        .find(|transport| !pairs.iter().any(|(t, d)| t == *transport && *d == port))
    {
        Some(missing) => Err(missing),
        None => Ok(()),
    }
}

/// How long one `ucx_info -d` may take: a hang bound (it loads every UCX module it has and
/// opens every transport, each of its verbs a command through the agent, under nested TCG).
const UCX_INFO_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `command` (an `ucx_info -d`) and returns what it listed, which must include the verbs
/// transports on `device` port 1.
fn listing_of(name: &str, command: &mut Command, device: &str) -> Result<Vec<(String, String)>> {
    let mut ucx_info = Proc::spawn(name, command)?;
    ucx_info.wait_success(UCX_INFO_TIMEOUT)?;
    let text = ucx_info.output();
    let pairs = ucx_devices(&text);
    verbs_transports_on(&pairs, device)
        .map_err(|missing| ucx_info.failure(&format!("lists no {missing} on {device}:1")))?;
    Ok(pairs)
}

/// The environment of a process over the drop-in in `library_dir` and the agent at `socket`.
pub(crate) fn dropin_env(socket: &Path, library_dir: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("VRDMA_AGENT", socket.to_string_lossy().into_owned()),
        (
            "LD_LIBRARY_PATH",
            library_dir.to_string_lossy().into_owned(),
        ),
    ]
}

/// `name=value` pairs, shell-quoted, each after a space.
pub(crate) fn shell_env(env: &[(&str, String)]) -> String {
    env.iter()
        .map(|(name, value)| format!(" {name}={}", shell_quote(value)))
        .collect()
}

/// `command` (with its arguments, shell-quoted) as `nobody` with the variables `env`, run by
/// `sh -c` after `setup` (shell lines).
pub(crate) fn as_nobody(setup: &str, env: &[(&str, String)], command: &str) -> String {
    format!(
        "set -e\n{setup}exec setpriv --reuid={uid} --regid={gid} --clear-groups -- \
         env{env} {command}\n",
        uid = NOBODY.0,
        gid = NOBODY.1,
        env = shell_env(env),
    )
}

/// The shell lines that mount `published` where UCX looks, as a container runtime would.
pub(crate) fn container_setup(published: &Path) -> String {
    format!(
        "mount --bind {class} /sys/class/infiniband\n\
         mount -t tmpfs -o mode=0755 tmpfs /dev/infiniband\n\
         touch /dev/infiniband/{VRDMA_DEVICE}\n\
         mount --bind {node} /dev/infiniband/{VRDMA_DEVICE}\n",
        class = shell_quote(&published.join("class/infiniband").to_string_lossy()),
        node = shell_quote(&published_node(published).to_string_lossy()),
    )
}

/// The shell lines that make a container of this one that was given both the host's RDMA
/// devices (rxe0's node and sysfs entry) and vrdma0 (the agent's publication in
/// `published`): a tmpfs at `/mnt` holds both sets, bind-mounted where RDMA software looks.
pub(crate) fn container_with_native_setup(published: &Path) -> String {
    format!(
        "mount -t tmpfs -o mode=0755 tmpfs /mnt\n\
         mkdir /mnt/dev /mnt/class\n\
         cp -a /dev/infiniband/. /mnt/dev/\n\
         for device in /sys/class/infiniband/*; do ln -s \"$(readlink -f \"$device\")\" /mnt/class/; done\n\
         ln -s {class} /mnt/class/{VRDMA_DEVICE}\n\
         touch /mnt/dev/{VRDMA_DEVICE}\n\
         mount --bind /mnt/dev /dev/infiniband\n\
         mount --bind {node} /dev/infiniband/{VRDMA_DEVICE}\n\
         mount --bind /mnt/class /sys/class/infiniband\n",
        class = shell_quote(
            &published
                .join("class/infiniband")
                .join(VRDMA_DEVICE)
                .to_string_lossy()
        ),
        node = shell_quote(&published_node(published).to_string_lossy()),
    )
}

/// `sh_script` in a private mount namespace, as a container's process.
pub(crate) fn in_container(sh_script: String) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(sh_script)
        .env_remove("VRDMA_SOCKET");
    command
}

/// `program` (its name and arguments) natively, and as `nobody` over the drop-in and the agent
/// at `agent_socket` in a container with the agent's publication in `published` mounted.
fn native_and_in_container(
    program: &[&str],
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
) -> [Command; 2] {
    let mut native = Command::new(program[0]);
    native.args(&program[1..]);
    let quoted: Vec<String> = program.iter().map(|a| shell_quote(a)).collect();
    let contained = in_container(as_nobody(
        &container_setup(published),
        &dropin_env(agent_socket, library_dir),
        &quoted.join(" "),
    ));
    [native, contained]
}

/// Process mode: `ucx_info -d` natively, then as `nobody` over the drop-in and the agent, with
/// the agent's publication in `published` mounted where UCX looks, as a container runtime
/// would mount it.
pub fn ucx_listing(
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
) -> Result<UcxListing> {
    let [mut native, mut vrdma] =
        native_and_in_container(&["ucx_info", "-d"], published, agent_socket, library_dir);
    let native = listing_of("ucx-info-native", &mut native, DEVICE)?;
    let vrdma = listing_of("ucx-info-container", &mut vrdma, VRDMA_DEVICE)?;
    Ok(UcxListing { native, vrdma })
}

/// What `fi_info -p verbs` listed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricListing {
    /// `(provider, domain, endpoint type)` of each entry natively.
    pub native: Vec<(String, String, String)>,
    /// The same over vrdma.
    pub vrdma: Vec<(String, String, String)>,
}

/// The `(provider, endpoint type)` entries a verbs device must have: libfabric's verbs MSG
/// endpoints and the RDM endpoints its `ofi_rxm` utility provider builds over them (what
/// MPI and most libfabric users open).
pub const FABRIC_ENTRIES: &[(&str, &str)] =
    &[("verbs", "FI_EP_MSG"), ("verbs;ofi_rxm", "FI_EP_RDM")];

/// The `(provider, domain, type)` entries of `fi_info`'s output.
pub fn fabric_entries(output: &str) -> Vec<(String, String, String)> {
    let mut entries = Vec::new();
    let (mut provider, mut domain) = (None, None);
    for line in output.lines() {
        let Some((key, value)) = line.trim().split_once(':') else {
            continue;
        };
        let value = value.trim().to_string();
        match key {
            "provider" => (provider, domain) = (Some(value), None),
            "domain" => domain = Some(value),
            "type" => {
                if let (Some(p), Some(d)) = (&provider, &domain) {
                    entries.push((p.clone(), d.clone(), value));
                }
            }
            _ => {}
        }
    }
    entries
}

/// The first of [`FABRIC_ENTRIES`] that `entries` lack on `domain`.
fn fabric_entries_on(
    entries: &[(String, String, String)],
    domain: &str,
) -> Result<(), (&'static str, &'static str)> {
    match FABRIC_ENTRIES.iter().find(|(provider, kind)| {
        !entries
            .iter()
            .any(|(p, d, t)| p == provider && d == domain && t == kind)
    }) {
        Some(missing) => Err(*missing),
        None => Ok(()),
    }
}

/// How long one `fi_info` may take: a hang bound.
const FI_INFO_TIMEOUT: Duration = Duration::from_secs(300);

fn fabric_listing_of(
    name: &str,
    command: &mut Command,
    domain: &str,
) -> Result<Vec<(String, String, String)>> {
    let mut fi_info = Proc::spawn(name, command)?;
    fi_info.wait_success(FI_INFO_TIMEOUT)?;
    let entries = fabric_entries(&fi_info.output());
    fabric_entries_on(&entries, domain).map_err(|(provider, kind)| {
        fi_info.failure(&format!("lists no {provider} {kind} on {domain}"))
    })?;
    Ok(entries)
}

/// Process mode: unmodified `fi_info -p verbs` natively, then as `nobody` over the drop-in and
/// the agent with the publication mounted as a container runtime would; each must list the
/// device's [`FABRIC_ENTRIES`]. (libfabric finds a verbs device's MSG endpoints through the
/// netdevs' addresses and binds `localhost` to find the device its RDM endpoints use: spec
/// §7.5's loopback rule.)
pub fn fabric_listing(
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
) -> Result<FabricListing> {
    let [mut native, mut vrdma] = native_and_in_container(
        &["fi_info", "-p", "verbs"],
        published,
        agent_socket,
        library_dir,
    );
    let native = fabric_listing_of("fi-info-native", &mut native, DEVICE)?;
    let vrdma = fabric_listing_of("fi-info-container", &mut vrdma, VRDMA_DEVICE)?;
    Ok(FabricListing { native, vrdma })
}

/// The UCX transports the traffic runs on: RC for the data, UD for UCP's wire-up.
const UCX_TLS: &str = "rc_verbs,ud_verbs";

/// The `ucx_perftest` protocol-layer tests run between a native side and a vrdma side.
pub const UCX_PERFTESTS: &[&str] = &["tag_lat", "tag_bw"];

/// Iterations of each `ucx_perftest` run.
pub const UCX_ITERATIONS: u64 = 1000;

/// How long one `ucx_perftest` run may take: a hang bound.
const UCX_PERFTEST_TIMEOUT: Duration = Duration::from_secs(300);

/// Which way a stack's process reaches RDMA: natively on rxe0, or as `nobody` over the drop-in
/// and the agent, in a container's mount namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StackSide {
    #[default]
    Native,
    Vrdma,
}

impl StackSide {
    pub fn name(self) -> &'static str {
        match self {
            StackSide::Native => "native",
            StackSide::Vrdma => "vrdma",
        }
    }

    /// The UCX device (`UCX_NET_DEVICES`) of this side.
    pub fn ucx_device(self) -> String {
        match self {
            StackSide::Native => format!("{DEVICE}:1"),
            StackSide::Vrdma => format!("{VRDMA_DEVICE}:1"),
        }
    }
}

/// One `ucx_perftest` run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UcxRun {
    pub test: String,
    /// Which side served (the client is the other).
    pub server: StackSide,
    /// The iterations the client's `Final:` line reports.
    pub iterations: u64,
    /// That line, as printed.
    pub final_line: String,
}

/// The iterations and the text of `ucx_perftest`'s `Final:` line.
fn final_line(output: &str) -> Option<(u64, String)> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Final:"))?;
    let iterations = line.split_whitespace().nth(1)?.parse().ok()?;
    Some((iterations, line.trim().to_string()))
}

/// The arguments of `ucx_perftest` running `test` on `port`, a client when `server` is given.
/// `-P 0`: Debian's build would otherwise start MPI when stdin is not a terminal.
fn perftest_args(test: &str, port: u16, server: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = ["-P", "0", "-t", test, "-n", &UCX_ITERATIONS.to_string()]
        .into_iter()
        .map(String::from)
        .collect();
    args.extend(["-p".into(), port.to_string()]);
    args.extend(server.map(String::from));
    args
}

/// `program` with `args` and the variables `env` on `side`: natively on rxe0, or as `nobody`
/// over the drop-in and the agent in a container's mount namespace.
pub(crate) fn stack_command(
    side: StackSide,
    program: &str,
    args: &[String],
    env: &[(&str, String)],
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
) -> Command {
    match side {
        StackSide::Vrdma => {
            let line: Vec<String> = std::iter::once(program.to_string())
                .chain(args.iter().map(|a| shell_quote(a)))
                .collect();
            let mut all = dropin_env(agent_socket, library_dir);
            all.extend(env.iter().cloned());
            in_container(as_nobody(
                &container_setup(published),
                &all,
                &line.join(" "),
            ))
        }
        StackSide::Native => {
            let mut command = Command::new(program);
            command.args(args).envs(env.iter().map(|(k, v)| (k, v)));
            command
        }
    }
}

/// Starts `server` (`name`-server), waits until it listens on TCP `port`, then runs `client`
/// (`name`-client); both must exit 0 within `timeout`. Returns both, for their output.
pub(crate) fn serve_and_run(
    name: &str,
    server: &mut Command,
    client: &mut Command,
    port: u16,
    timeout: Duration,
) -> Result<(Proc, Proc)> {
    let mut server = Proc::spawn(&format!("{name}-server"), server)?;
    server.wait_listening(port, timeout)?;
    let mut client = Proc::spawn(&format!("{name}-client"), client)?;
    client.wait_success(timeout)?;
    server.wait_success(timeout)?;
    Ok((server, client))
}

/// Process mode: unmodified `ucx_perftest` (UCP tag matching over rc_verbs, wired up over
/// ud_verbs) between a native side on rxe0 and a vrdma side (`nobody`, drop-in, agent, the
/// agent's publication mounted as a container runtime would), each test with each side
/// serving. Each run must end with both exit statuses 0 and the client's `Final:` line
/// reporting every iteration. (`ucx_perftest` measures; it does not check payloads.)
pub fn ucx_traffic(
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
    mut next_port: impl FnMut() -> u16,
) -> Result<Vec<UcxRun>> {
    let mut runs = Vec::new();
    for test in UCX_PERFTESTS {
        for (server_side, client_side) in [
            (StackSide::Native, StackSide::Vrdma),
            (StackSide::Vrdma, StackSide::Native),
        ] {
            let port = next_port();
            let on = |side: StackSide, server: Option<&str>| {
                let env = [
                    ("UCX_NET_DEVICES", side.ucx_device()),
                    ("UCX_TLS", UCX_TLS.to_string()),
                ];
                let args = perftest_args(test, port, server);
                stack_command(
                    side,
                    "ucx_perftest",
                    &args,
                    &env,
                    published,
                    agent_socket,
                    library_dir,
                )
            };
            let (_server, client) = serve_and_run(
                &format!(
                    "ucx-perftest-{test}-{}-{}",
                    server_side.name(),
                    client_side.name()
                ),
                &mut on(server_side, None),
                &mut on(client_side, Some("127.0.0.1")),
                port,
                UCX_PERFTEST_TIMEOUT,
            )?;
            let (iterations, final_line) = final_line(&client.output())
                .ok_or_else(|| client.failure("printed no Final: line"))?;
            if iterations != UCX_ITERATIONS {
                return Err(client.failure(&format!(
                    "ran {iterations} iterations, not {UCX_ITERATIONS}"
                )));
            }
            println!(
                "  ok: ucx_perftest {test}, server {}: {final_line}",
                server_side.name()
            );
            runs.push(UcxRun {
                test: test.to_string(),
                server: server_side,
                iterations,
                final_line,
            });
        }
    }
    Ok(runs)
}

/// VM mode (`vrdma-guestd --pci` publishes at the system paths): what UCX reads there, as
/// `(path, what it holds)`: the node, a character device with the agent socket's group and
/// mode, and each GID's type, at least one of them RoCE v2. (`ucx_info -d` itself runs over the
/// same files in process mode: in the nested guest it took 2 to 10 minutes.)
pub fn published_in_vm(agent_socket: &Path) -> Result<Vec<(String, String)>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let node = Path::new("/dev/infiniband").join(VRDMA_DEVICE);
    let stat = |path: &Path| {
        std::fs::metadata(path).map_err(|e| Error::Scenario(format!("{}: {e}", path.display())))
    };
    let (node_meta, socket_meta) = (stat(&node)?, stat(agent_socket)?);
    let same_access = node_meta.mode() & 0o777 == socket_meta.mode() & 0o777
        && node_meta.gid() == socket_meta.gid();
    if !node_meta.file_type().is_char_device() || !same_access {
        return Err(Error::Scenario(format!(
            "{} is not a character device with the agent socket's access: {node_meta:?}",
            node.display()
        )));
    }
    let mut published = vec![(
        node.display().to_string(),
        format!(
            "character device, mode {:o}, group {}",
            node_meta.mode() & 0o777,
            node_meta.gid()
        ),
    )];
    let types = Path::new("/sys/class/infiniband")
        .join(VRDMA_DEVICE)
        .join("ports/1/gid_attrs/types");
    let entries = std::fs::read_dir(&types)
        .map_err(|e| Error::Scenario(format!("{}: {e}", types.display())))?;
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        published.push((entry.path().display().to_string(), text.trim().to_string()));
    }
    if !published.iter().any(|(_, text)| text == "RoCE v2") {
        return Err(Error::Scenario(format!(
            "no RoCE v2 GID in {}: {published:?}",
            types.display()
        )));
    }
    Ok(published)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of `ucx_info -d` (UCX 1.18), trimmed.
    const LISTING: &str = "\
#      Transport: tcp
#         Device: lo
#  Type: network
#      Transport: rc_verbs
#         Device: vrdma0:1
#           capabilities:
#      Transport: ud_verbs
#         Device: vrdma0:1
#       error handling: peer failure, ep_check
";

    #[test]
    fn transports_are_paired_with_their_devices() {
        let pairs = ucx_devices(LISTING);
        assert_eq!(
            pairs,
            [
                ("tcp".to_string(), "lo".to_string()),
                ("rc_verbs".into(), "vrdma0:1".into()),
                ("ud_verbs".into(), "vrdma0:1".into()),
            ]
        );
        assert!(verbs_transports_on(&pairs, "vrdma0").is_ok());
        assert!(verbs_transports_on(&pairs, "rxe0").is_err());
        let without_ud = ucx_devices(&LISTING.replace("ud_verbs", "ud_mlx5"));
        assert!(verbs_transports_on(&without_ud, "vrdma0").is_err());
    }

    /// The shape of `fi_info -p verbs` (libfabric 2.0), trimmed.
    const FI_INFO: &str = "\
provider: verbs
    fabric: IB-0xfe80000000000000
    domain: vrdma0
    version: 201.0
    type: FI_EP_MSG
    protocol: FI_PROTO_RDMA_CM_IB_RC
provider: verbs
    fabric: IB-0xfe80000000000000
    domain: vrdma0-dgram
    type: FI_EP_DGRAM
provider: verbs;ofi_rxm
    fabric: IB-0xfe80000000000000
    domain: vrdma0
    type: FI_EP_RDM
";

    #[test]
    fn fabric_entries_pair_providers_domains_and_types() {
        let entries = fabric_entries(FI_INFO);
        assert_eq!(entries.len(), 3);
        assert_eq!(
            entries[2],
            ("verbs;ofi_rxm".into(), "vrdma0".into(), "FI_EP_RDM".into())
        );
        assert!(fabric_entries_on(&entries, "vrdma0").is_ok());
        assert!(fabric_entries_on(&entries, "rxe0").is_err());
        let without_rdm = fabric_entries(&FI_INFO.replace("FI_EP_RDM", "FI_EP_DGRAM"));
        assert_eq!(
            fabric_entries_on(&without_rdm, "vrdma0"),
            Err(("verbs;ofi_rxm", "FI_EP_RDM"))
        );
    }

    #[test]
    fn the_final_line_gives_the_iterations() {
        let output = "\
[thread 0]               806    672.000   620.429   620.429        0.01       0.01        1612        1612
Final:                  1000    676.500   702.435   636.338        0.01       0.01        1424        1571
";
        let (iterations, line) = final_line(output).unwrap();
        assert_eq!(iterations, 1000);
        assert!(line.starts_with("Final:"));
        assert_eq!(final_line("[thread 0]  806  672.0"), None);
        assert_eq!(final_line("Final: nan"), None);
    }
}

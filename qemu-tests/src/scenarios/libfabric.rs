//! libfabric over vrdma: Debian's unmodified `fi_pingpong` (libfabric's verbs provider: its MSG
//! endpoints connected through rdma_cm, and the RDM endpoints `ofi_rxm` builds over them)
//! between a native side on rxe0 and `nobody` over the
//! drop-in and the agent in a container's mount namespace, each side serving, after the
//! native pair as the baseline. `-c`: fi_pingpong checks every message's data; `-S all`: every
//! size it has (8 B to 6 MiB).
//!
//! The VM's RDMA netdev has only an IPv6 link-local address: both sides run `-6`, the client
//! aims at `address%netdev`, and the server is given no `-s` (fi_pingpong turns `-s` into an
//! `addr_format` of `AF_INET6`, which is not libfabric's `FI_SOCKADDR_IN6`, and finds nothing).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::scenarios::discovery::{serve_and_run, stack_command, StackSide};

/// The (server, client) sides of each run.
pub const PAIRINGS: [(StackSide, StackSide); 3] = [
    (StackSide::Native, StackSide::Native),
    (StackSide::Native, StackSide::Vrdma),
    (StackSide::Vrdma, StackSide::Native),
];

/// The endpoint types each pairing runs: libfabric's verbs MSG endpoints, and the RDM
/// endpoints its `ofi_rxm` utility provider builds over them (what MPI and most libfabric
/// users open), as `(provider, endpoint type)`.
pub const ENDPOINTS: [(&str, &str); 2] = [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")];

/// The peers one RDM endpoint expects (`FI_UNIVERSE_SIZE`, default 1024): rxm sizes its MSG
/// CQ as (rx + tx depth) × universe, and 256 × 1024 entries are more than rxe's `max_cqe`
/// (32767), natively as over vrdma.
const UNIVERSE_SIZE: &str = "4";

/// Round trips of each size.
pub const ITERATIONS: u64 = 10;

/// How long one side may take: a hang bound (6 MiB messages under TCG take seconds each).
const TIMEOUT: Duration = Duration::from_secs(600);

/// One fi_pingpong run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricRun {
    pub server: StackSide,
    pub client: StackSide,
    /// `msg` or `rdm` ([`ENDPOINTS`]).
    #[serde(default)]
    pub endpoint: String,
    /// The sizes the client reported, each with every round trip done and acknowledged.
    pub sizes: Vec<String>,
}

/// The sizes of fi_pingpong's result rows (`size #sent #ack total time MB/sec ...`) whose sent
/// and acknowledged counts are both `iterations`; `None` if a row says otherwise.
fn completed_sizes(output: &str, iterations: u64) -> Option<Vec<String>> {
    let mut sizes = Vec::new();
    for line in output.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [size, sent, ack, ..] = fields.as_slice() else {
            continue;
        };
        let Some(ack) = ack.strip_prefix('=') else {
            continue;
        };
        let (Ok(sent), Ok(ack)) = (sent.parse::<u64>(), ack.parse::<u64>()) else {
            continue;
        };
        if sent != iterations || ack != iterations {
            return None;
        }
        sizes.push(size.to_string());
    }
    Some(sizes)
}

/// fi_pingpong's arguments: a server on control port `port`, or a client of `server_address`.
fn arguments(
    (provider, endpoint): (&str, &str),
    port: u16,
    server_address: Option<&str>,
) -> Vec<String> {
    let mut args: Vec<String> = ["-6", "-c", "-p", provider, "-e", endpoint, "-S", "all"]
        .into_iter()
        .map(String::from)
        .collect();
    args.extend(["-I".into(), ITERATIONS.to_string()]);
    match server_address {
        None => args.extend(["-B".into(), port.to_string()]),
        Some(address) => args.extend(["-P".into(), port.to_string(), address.into()]),
    }
    args
}

/// Process mode: the runs of [`PAIRINGS`] on the RDMA netdev's link-local `address`
/// (`ip%netdev`); each must end with both exit statuses 0 and the same sizes on both sides,
/// every round trip of every size done.
pub fn fabric_traffic(
    address: &str,
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
    mut next_port: impl FnMut() -> u16,
) -> Result<Vec<FabricRun>> {
    let mut runs = Vec::new();
    let env = [("FI_UNIVERSE_SIZE", UNIVERSE_SIZE.to_string())];
    for endpoints @ (_, endpoint) in ENDPOINTS {
        for (server_side, client_side) in PAIRINGS {
            let port = next_port();
            let on = |side: StackSide, server: Option<&str>| {
                let args = arguments(endpoints, port, server);
                stack_command(
                    side,
                    "fi_pingpong",
                    &args,
                    &env,
                    published,
                    agent_socket,
                    library_dir,
                )
            };
            let (server, client) = serve_and_run(
                &format!(
                    "fi-pingpong-{endpoint}-{}-{}-{port}",
                    server_side.name(),
                    client_side.name()
                ),
                &mut on(server_side, None),
                &mut on(client_side, Some(address)),
                port,
                TIMEOUT,
            )?;
            let client_sizes = completed_sizes(&client.output(), ITERATIONS)
                .ok_or_else(|| client.failure("reported a size with round trips missing"))?;
            let server_sizes = completed_sizes(&server.output(), ITERATIONS)
                .ok_or_else(|| server.failure("reported a size with round trips missing"))?;
            if client_sizes.is_empty() || client_sizes != server_sizes {
                return Err(client.failure(&format!(
                    "sizes {client_sizes:?}, the server's {server_sizes:?}"
                )));
            }
            println!(
            "  ok: fi_pingpong {endpoint} -c, server {} client {}: {} sizes ({}..{}), {ITERATIONS} round trips each",
            server_side.name(),
            client_side.name(),
            client_sizes.len(),
            client_sizes[0],
            client_sizes[client_sizes.len() - 1]
        );
            runs.push(FabricRun {
                server: server_side,
                client: client_side,
                endpoint: endpoint.to_string(),
                sizes: client_sizes,
            });
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rows_with_every_round_trip_count() {
        let output = "\
bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
8       10      =10      160         0.02s      0.01    1084.10       0.00
6m      10      =10      120m       15.04s      8.36  752242.12       0.00
";
        assert_eq!(
            completed_sizes(output, 10),
            Some(vec!["8".into(), "6m".into()])
        );
        assert_eq!(
            completed_sizes(&output.replace("=10      120m", "=9      120m"), 10),
            None
        );
        assert_eq!(completed_sizes("fi_getinfo(): ret=-61", 10), Some(vec![]));
    }

    #[test]
    fn a_client_names_the_control_port_and_the_server_its_own() {
        let server = arguments(ENDPOINTS[0], 7000, None);
        assert_eq!(
            server[server.len() - 2..],
            ["-B".to_string(), "7000".into()]
        );
        let client = arguments(ENDPOINTS[0], 7000, Some("fe80::1%d0"));
        assert_eq!(
            client[client.len() - 3..],
            ["-P".to_string(), "7000".into(), "fe80::1%d0".into()]
        );
    }
}

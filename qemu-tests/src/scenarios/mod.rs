//! Test scenarios that run inside the rxe VM against a live vrdma-backend.

pub mod agent;
pub mod backend;
pub mod binaries;
pub mod discovery;
pub mod isolation;
pub mod libfabric;
pub mod mpi;
pub mod perftest_over_vrdma;
pub mod perftest_rdma_cm;
pub mod pin_budget;
pub mod pingpong_peer;
pub mod process_pingpong;
pub mod qtest_pingpong;
pub mod qtest_qp_scale;
pub mod rdma_core_suite;
pub mod rdmacm_backend_kill;
pub mod rdmacm_suite;
pub mod rdmacm_utils;
pub mod readme_qemu;
pub mod real_guest;
pub mod rspreload;
pub mod tenants;
pub mod two_hosts;
pub mod verbs_utils;

/// A fixed-width table of program runs between a server and a client: the program (in a
/// column of `width`), each side's label and the client's report.
pub fn pairing_table<'a>(
    width: usize,
    runs: impl IntoIterator<Item = (&'a str, &'a str, &'a str, String)>,
) -> String {
    let mut out = format!(
        "{:<width$} {:<7} {:<7} {}\n",
        "program", "server", "client", "client's report"
    );
    for (program, server, client, report) in runs {
        out.push_str(&format!(
            "{program:<width$} {server:<7} {client:<7} {report}\n"
        ));
    }
    out
}

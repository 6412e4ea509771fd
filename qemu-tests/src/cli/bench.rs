//! `vrdma-vm bench`: the benchmarks in one boot of the VM (see [`crate::bench`]).

use std::path::PathBuf;

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::{dropin_library, prepared_root};
use super::two_hosts;
use super::vm_args::VmArgs;
use crate::bench;
use crate::error::Result;

/// `vrdma-vm bench`: boots the VM, prints the tables and writes `json` when asked.
pub fn run(vm_args: &VmArgs, settings: &bench::Settings, json: Option<PathBuf>) -> Result<()> {
    let root = prepared_root()?;
    let mut config = vm_args.config(&root)?;
    config.echo = true;
    let (_, library) = dropin_library()?;
    // The guest's part is not copied to `json`: `write_json` adds the machine information.
    let mut results = bench::run_on_host(settings, &config, &library, |args| {
        run_guest_suite(&root, &config, bench::SUITE, args, None)
    })?;
    if !settings.quick {
        let pair = two_hosts::host_config(&config);
        match two_hosts::run_hosts(&root, &pair, two_hosts::Mode::Goodput) {
            Ok(hosts) => results.goodput = bench::goodput::rows(&hosts),
            Err(e) => {
                log::warn!("the goodput run across the two-host link failed: {e}");
                results.goodput_error = Some(e.to_string());
            }
        }
    }
    if !settings.quick {
        match super::real_guest::run_suite(vm_args, None, false) {
            Ok((_, _, report)) => results.agent_pci = report.through_agent,
            Err(e) => {
                log::warn!("the real-guest run failed: {e}");
                results.agent_pci_error = Some(e.to_string());
            }
        }
    }
    print!("{}", bench::report::render(&results));
    if let Some(path) = json {
        bench::write_json(&results, &path)?;
    }
    Ok(())
}

/// `vrdma-vm guest bench`.
pub fn guest(args: &bench::GuestArgs) -> Result<()> {
    let results = bench::run_in_guest(args)?;
    deliver_results(bench::SUITE, &results, || {
        bench::report::render_guest(&results)
    })
}

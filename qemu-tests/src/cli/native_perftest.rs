//! `native-perftest`: perftest's five main tools natively on rxe0, the baseline vrdma is
//! compared against.

use std::path::PathBuf;

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::prepared_root;
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::perftest::{self, Row, Side};

/// `vrdma-vm test native-perftest`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let root = prepared_root()?;
    let mut config = vm_args.config(&root)?;
    config.echo = true;
    let (outcome, rows): (_, Vec<Row>) =
        run_guest_suite(&root, &config, "perftest", Vec::new(), json.as_deref())?;
    println!(
        "\nnative perftest on rxe0 ({:?}, {} vCPUs; VM run {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", perftest::render_table(&rows));
    Ok(())
}

/// `vrdma-vm guest perftest`.
pub fn guest(device: &str, port: u16) -> Result<()> {
    let side = Side::native(device);
    let mut rows = Vec::new();
    for case in perftest::BASELINE {
        println!(
            "running {} size {} x{} …",
            case.tool.command(),
            case.size,
            case.iterations
        );
        rows.push(perftest::run_case(case, &side, &side, port)?);
    }
    deliver_results("perftest", &rows, || perftest::render_table(&rows))
}

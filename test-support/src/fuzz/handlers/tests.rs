//! The handler fuzzer's fixed-seed and regression tests, run on every `cargo test`, and a
//! replay of a fuzzing corpus that says what its inputs reach.

use super::super::bytes::fixed_seed_inputs;
use super::*;

#[test]
fn fixed_seed_sequences_keep_every_invariant() {
    let mut total = SequenceStats::default();
    for input in fixed_seed_inputs(0x5eed_0001, 300, 2048) {
        total.add(run_handler_sequence_with(&input, SequenceConfig::default()));
    }
    eprintln!("{}", summary(&total));
    let SequenceStats {
        ok,
        connections,
        staged_wqes: (wqes, neutralised),
        cm_events,
        cm_events_inline,
        ..
    } = total;
    assert!(
        cm_events_inline > 0,
        "no CM event came whole in an event buffer"
    );
    // The tenancy checks had something to check: accepted and refused sends.
    assert!(connections > 0, "no connection was set up");
    assert!(
        wqes > neutralised && neutralised > 0,
        "staged sends: {wqes}, {neutralised}"
    );
    // The generator reaches every creation, not only failures.
    for op in [
        Opcode::AllocPd,
        Opcode::RegMr,
        Opcode::AllocMw,
        Opcode::CreateCq,
        Opcode::CreateQp,
        Opcode::ModifyQp,
        Opcode::CreateSrq,
        Opcode::CreateAh,
        Opcode::SetDoorbellArea,
        Opcode::ReregMr,
        Opcode::CmCreateId,
        Opcode::CmBind,
        Opcode::CmListen,
        Opcode::CmResolveAddr,
        Opcode::CmResolveRoute,
        Opcode::CmConnect,
        Opcode::CmAccept,
        Opcode::CmDisconnect,
        Opcode::CmInitQpAttr,
        Opcode::CmMoveQp,
        Opcode::CmDestroyId,
    ] {
        assert!(
            ok.get(&(op as u16)).copied().unwrap_or(0) > 0,
            "no successful {op:?}"
        );
    }
    // Connections between the guests form, and come down.
    use vrdma_spec::cm::cm_event::*;
    for event in [
        CONNECT_REQUEST,
        CONNECT_RESPONSE,
        ESTABLISHED,
        DISCONNECTED,
        REJECTED,
    ] {
        assert!(
            cm_events.get(&event).copied().unwrap_or(0) > 0,
            "no CM event {event} delivered"
        );
    }
}

/// A fuzz input (both guests tenants): guest 1 aims an RC QP at the host's address and a
/// QP number nobody has, then creates a QP that gets that number. The connection was
/// legitimate when it was set up, so connections are judged per command, not per step.
#[test]
fn a_connection_is_judged_when_it_is_set_up() {
    let without_cm = SequenceConfig {
        without_cm: true,
        ..SequenceConfig::default()
    };
    run_handler_sequence_with(
        &[
            255, 255, 255, 255, 255, 255, 255, 4, 120, 234, 0, 0, 0, 255, 65, 255, 255, 255, 255,
            255, 8, 0, 38, 5, 0, 9, 1, 0, 0, 0,
        ],
        without_cm,
    );
}

/// Every input the fuzzer found a bug with (`test-support/fuzz-regressions/`), run again:
/// read as before the CM steps existed (how the older ones were found) and as today.
#[test]
fn past_findings_keep_every_invariant() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz-regressions/handler_sequences"
    );
    let mut found = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        eprintln!("{}", path.display());
        let input = std::fs::read(&path).unwrap();
        for without_cm in [true, false] {
            let config = SequenceConfig {
                without_cm,
                ..SequenceConfig::default()
            };
            run_handler_sequence_with(&input, config);
        }
        found += 1;
    }
    assert!(found > 0, "no inputs in {dir}");
}

/// What a set of runs did, in one line.
fn summary(s: &SequenceStats) -> String {
    format!(
        "{} steps, {} connections, {} staged WQEs forwarded ({} neutralised); successes by \
         opcode: {:x?}; CM events delivered by number: {:?}",
        s.steps, s.connections, s.staged_wqes.0, s.staged_wqes.1, s.ok, s.cm_events
    )
}

/// Replays every input in the directory `VRDMA_REPLAY_CORPUS` names (a fuzzing corpus) and
/// prints what they reached, e.g. whether CM connections were established (event 9):
/// `VRDMA_REPLAY_CORPUS=dir cargo test -p vrdma-test-support replay_corpus -- --ignored
/// --nocapture`.
#[test]
#[ignore = "needs VRDMA_REPLAY_CORPUS"]
fn replay_corpus() {
    let dir = std::env::var_os("VRDMA_REPLAY_CORPUS").expect("VRDMA_REPLAY_CORPUS");
    let (mut total, mut inputs) = (SequenceStats::default(), 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let input = std::fs::read(entry.unwrap().path()).unwrap();
        total.add(run_handler_sequence_with(&input, SequenceConfig::default()));
        inputs += 1;
    }
    eprintln!("{inputs} inputs: {}", summary(&total));
}

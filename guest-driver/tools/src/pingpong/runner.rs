//! Runs a plan as server or client over an [`Endpoint`] (see the protocol in
//! [`crate::pingpong`]): the hello exchange and the plan check, then a `Session` (`session.rs`).

use vrdma::verbs::Context;

use super::endpoint::Endpoint;
use super::error::{Result, RunError};
use super::exchange::Message;
use super::oob::Channel;
use super::options::Options;
use super::plan::Plan;
use super::report::Report;
use super::session::Session;
use super::wait::{Completion, EventCounts};

/// What a server run leaves behind.
pub struct Served {
    /// Steps verified.
    pub steps: usize,
    /// The client's plan.
    pub plan: Plan,
    /// How completions were awaited, and what the event mode did over the whole run.
    pub completion: Completion,
    pub events: EventCounts,
    /// The device resources, still alive: destroying them needs the backend, so the caller
    /// reports first and drops them after.
    pub resources: Endpoint,
}

/// Runs the server side: accepts one client on `opts.host:opts.port`, runs its plan with an
/// area of `opts.len` bytes.
pub fn run_server(ctx: &Context, opts: &Options) -> Result<Served> {
    let mut channel = Channel::accept(&opts.host, opts.port, opts.timeout)?;
    let result = serve(ctx, opts, &mut channel);
    report_failure(&mut channel, &result);
    result
}

fn serve(ctx: &Context, opts: &Options, channel: &mut Channel) -> Result<Served> {
    let Message::Hello(client) = channel.receive()? else {
        return Err(RunError::Protocol(
            "the client did not start with a hello".into(),
        ));
    };
    let need = client.plan.area_len();
    if need > opts.len {
        return Err(RunError::Protocol(format!(
            "refusing plan {}: it needs an area of {need} bytes, this server has {} (see --len)",
            client.plan.to_wire(),
            opts.len
        )));
    }
    if client.len < need {
        return Err(RunError::Protocol(format!(
            "client area of {} bytes is too small for its plan",
            client.len
        )));
    }
    let endpoint = Endpoint::new(ctx, &client.plan, opts.len)?;
    channel.send(&Message::Hello(endpoint.hello.clone()))?;
    let plan = client.plan.clone();
    let mut session = Session::start(endpoint, client, channel, opts, true)?;
    session.run()?;
    Ok(Served {
        steps: session.steps_done,
        plan,
        completion: session.waiter.mode(),
        events: session.waiter.counts(),
        resources: session.ep,
    })
}

/// Runs the client side with `plan`: connects to the server and returns the measured results.
pub fn run_client(ctx: &Context, plan: &Plan, opts: &Options) -> Result<Report> {
    let endpoint = Endpoint::new(ctx, plan, opts.len.max(plan.area_len()))?;
    let mut channel = Channel::connect(&opts.host, opts.port, opts.timeout)?;
    let result = (|| {
        channel.send(&Message::Hello(endpoint.hello.clone()))?;
        let Message::Hello(server) = channel.receive()? else {
            return Err(RunError::Protocol(
                "the server did not answer with a hello".into(),
            ));
        };
        if server.plan != *plan {
            return Err(RunError::Protocol(format!(
                "the server answered with plan {}, not {}",
                server.plan.to_wire(),
                plan.to_wire()
            )));
        }
        if server.len < plan.area_len() {
            return Err(RunError::Protocol(format!(
                "server area of {} bytes is too small for the plan",
                server.len
            )));
        }
        let mut session = Session::start(endpoint, server, &mut channel, opts, false)?;
        session.run()?;
        Ok(Report {
            implementation: "vrdma".into(),
            mode: plan.mode(),
            rows: std::mem::take(&mut session.rows),
        })
    })();
    report_failure(&mut channel, &result);
    result
}

fn report_failure<T>(channel: &mut Channel, result: &Result<T>) {
    if let Err(e) = result {
        if !e.caused_by_peer() {
            channel.report_failure(&e.to_string());
        }
    }
}

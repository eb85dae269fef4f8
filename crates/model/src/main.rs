//! `model`: checks the idempotency protocol breadth-first and prints each property's result.
//! `--size small|full|capture` (full by default), `--defect NAME` (repeatable) switches a known defect on,
//! `--threads N` (2 by default, 1 with a defect: the same counterexample every run). Exits 1 when a property fails, with the trace that shows it.

use std::process::ExitCode;

use model::check::PropertyOutcome;
use model::{Config, Defect, Size, check};

fn main() -> ExitCode {
    let mut size = Size::full();
    let mut defects = Vec::new();
    let mut threads = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next();
        match (arg.as_str(), value.as_deref()) {
            ("--size", Some("small")) => size = Size::small(),
            ("--size", Some("full")) => size = Size::full(),
            ("--size", Some("capture")) => size = Size::capture(),
            ("--defect", Some(name)) => match Defect::parse(name) {
                Some(defect) => defects.push(defect),
                None => return usage(&format!("no defect named {name}")),
            },
            ("--threads", Some(n)) => match n.parse() {
                Ok(n) if n > 0 => threads = Some(n),
                _ => return usage(&format!("not a number of threads: {n}")),
            },
            _ => return usage(&format!("unknown argument {arg}")),
        }
    }
    println!("checking {size}");
    for defect in &defects {
        println!("with the defect {}", defect.name());
    }
    // A defect is found in a moment: on one thread, the run and its counterexample are the same
    // every time.
    let threads = threads.unwrap_or(if defects.is_empty() { 2 } else { 1 });
    let report = check(Config { size, defects }, threads);
    println!(
        "{} distinct states in {:.1} s{}",
        report.states,
        report.elapsed.as_secs_f64(),
        if report.complete {
            ""
        } else {
            " (stopped at the first counterexample)"
        }
    );
    for result in &report.results {
        let kind = if result.always { "always" } else { "sometimes" };
        let verdict = match &result.outcome {
            PropertyOutcome::Holds if result.always => "holds",
            PropertyOutcome::Holds => "found",
            PropertyOutcome::Violated(_) => "VIOLATED",
            PropertyOutcome::NeverSeen => "NEVER SEEN",
            PropertyOutcome::NotReached => "not reached",
        };
        println!("  {kind:9} {:60} {verdict}", result.name);
        if let PropertyOutcome::Violated(trace) = &result.outcome {
            println!("    counterexample, {} steps:", trace.len());
            for (n, action) in trace.iter().enumerate() {
                println!("    {:3}. {action:?}", n + 1);
            }
        }
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn usage(problem: &str) -> ExitCode {
    let names: Vec<&str> = Defect::ALL.iter().map(|defect| defect.name()).collect();
    eprintln!(
        "{problem}\nusage: model [--size small|full|capture] [--threads N] [--defect NAME]...\n\
         defects: {}",
        names.join(", ")
    );
    ExitCode::from(2)
}

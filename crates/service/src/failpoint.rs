//! Crash points for fault-injection tests. With the `failpoints` feature, a process whose
//! `IDEMPAY_FAILPOINT` names a point aborts there, as a power cut would: no unwinding, no cleanup,
//! open transactions left for PostgreSQL to roll back. Without the feature they compile to nothing.
//! A few points [`panic()`] instead: a bug in one task, which the process survives.

/// Aborts the process if `IDEMPAY_FAILPOINT` is `point` (only with the `failpoints` feature).
#[cfg(feature = "failpoints")]
pub fn hit(point: &str) {
    if std::env::var("IDEMPAY_FAILPOINT").is_ok_and(|chosen| chosen == point) {
        eprintln!("failpoint {point}: aborting");
        std::process::abort();
    }
}

/// Aborts the process if `IDEMPAY_FAILPOINT` is `point` (only with the `failpoints` feature).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_point: &str) {}

/// Panics (unwinds the task it runs in, as a bug would) if `IDEMPAY_FAILPOINT` is `point` (only
/// with the `failpoints` feature).
#[cfg(feature = "failpoints")]
pub fn panic(point: &str) {
    if std::env::var("IDEMPAY_FAILPOINT").is_ok_and(|chosen| chosen == point) {
        eprintln!("failpoint {point}: panicking");
        panic!("failpoint {point}");
    }
}

/// Panics if `IDEMPAY_FAILPOINT` is `point` (only with the `failpoints` feature).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn panic(_point: &str) {}

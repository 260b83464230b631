//! Faults injected on purpose, by the `FAILPOINTS` variable (the `fail`
//! crate), in tests that stop a partition move at a chosen step.

/// A fault injected on purpose (by the `FAILPOINTS` variable, in tests of
/// moves interrupted at a chosen step): logged, so the test sees the step
/// reached. The step fails and is tried again, so the move waits there.
pub fn hit(name: &str) -> tonic::Status {
    tracing::warn!(
        failpoint = name,
        "failpoint hit: this step fails on purpose"
    );
    tonic::Status::unavailable(format!("failpoint {name}"))
}

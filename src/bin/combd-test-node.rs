//! `combd-test-node`: the `combd` node with the test apps (`combd_testkit::apps`) registered
//! beside the built-in ones, for the tests, the fuzz harness and the benchmarks. Never run in
//! production; the `combd` binary does not carry these apps.

#![forbid(unsafe_code)]

/// Counts what a call of a cell allocates, for apps with a `memory_kb` limit.
#[global_allocator]
static ALLOC: combd_shards::alloc::CountingAlloc = combd_shards::alloc::CountingAlloc;

fn main() {
    combd::serve::main(combd_testkit::apps::register);
}

//! `combd`: the node with the built-in apps a user runs (`combd::apps`), and nothing else;
//! everything it does is [`combd::serve::main`].

#![forbid(unsafe_code)]

/// Counts what a call of a cell allocates, for apps with a `memory_kb` limit.
#[global_allocator]
static ALLOC: combd_shards::alloc::CountingAlloc = combd_shards::alloc::CountingAlloc;

fn main() {
    combd::serve::main(|_| {});
}

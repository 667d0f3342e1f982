use safemlx_dist::{sharded, Replicated, ShardedArray};

#[sharded(x @ Replicated)]
fn forward(x: ShardedArray<Replicated>) -> safemlx_dist::Result<ShardedArray<Replicated>> {
    Ok(x)
}

fn main() {}

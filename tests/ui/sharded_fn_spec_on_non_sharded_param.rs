use safemlx::{Array, Stream};
use safemlx_dist::{sharded, Replicated, ShardedArray};

#[sharded(bias @ Replicated)]
fn forward(x: ShardedArray<Replicated>, bias: Array, s: &Stream) -> safemlx_dist::Result<ShardedArray<Replicated>> {
    let _ = (bias, s);
    Ok(x)
}

fn main() {}

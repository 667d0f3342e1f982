use safemlx::Array;
use safemlx_dist::sharded;

#[sharded]
struct Layer {
    #[shard(Replicated)]
    bias: Array,
}

fn main() {}

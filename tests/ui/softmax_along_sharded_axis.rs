use safemlx::Stream;
use safemlx_dist::{Sharded, ShardedArray};

fn attention_weights(scores: &ShardedArray<Sharded<1>>, s: &Stream) {
    let _ = scores.softmax::<1>(s);
}

fn main() {}

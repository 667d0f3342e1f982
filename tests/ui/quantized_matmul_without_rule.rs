use safemlx::Stream;
use safemlx_dist::{QuantizedArray, Replicated, Sharded, ShardedArray};

// A replicated x times a weight split by inputs: no placement (x would
// have to be split by the same groups first).
fn layer(x: &ShardedArray<Replicated>, w: &QuantizedArray<Sharded<1>>, s: &Stream) {
    let _ = x.quantized_matmul(w, s);
}

fn main() {}

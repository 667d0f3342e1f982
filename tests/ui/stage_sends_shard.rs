// A stage sends its whole activation: a column shard of it does not
// compile as what the next stage receives. Gather it first.
use safemlx::Stream;
use safemlx_dist::typed::StageLink;
use safemlx_dist::{Sharded, ShardedArray};

fn send(link: &StageLink, x: &ShardedArray<Sharded<1>>, s: &Stream) {
    let _ = link.send_hidden(x, true, s);
}

fn main() {}

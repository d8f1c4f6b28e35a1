//! Our partitions and commits as librdkafka's `TopicPartitionList`, and
//! back.

use rdkafka::{Offset, TopicPartitionList};

use crate::kafka::offsets::Commit;
use crate::kafka::record::TopicPartition;

/// The partitions of a list librdkafka hands over.
pub(super) fn partitions_of(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| TopicPartition::new(e.topic(), e.partition()))
        .collect()
}

/// Partitions as librdkafka takes them, with no offsets.
pub(super) fn partition_list(parts: &[TopicPartition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(parts.len());
    for tp in parts {
        tpl.add_partition(&tp.topic, tp.partition);
    }
    tpl
}

/// Commits as librdkafka takes them: each partition's offset and the
/// metadata that carries its finished records to the next owner.
pub(super) fn commit_list(commits: &[Commit]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(commits.len());
    for c in commits {
        // Cannot fail for a partition just added: set_partition_offset only
        // errs when the partition is missing from the list.
        let mut elem = tpl.add_partition(&c.topic, c.partition);
        let _ = elem.set_offset(Offset::Offset(c.offset));
        elem.set_metadata(c.metadata.as_str());
    }
    tpl
}

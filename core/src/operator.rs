//! `coordination: operator` — beside an operator that moves primaries itself (valkey-operator's
//! `ValkeyCluster`), the agent's own moves (fail-back, balance) wait while the operator is at
//! work, so the two never move one shard at once. Hand-overs of primaries whose pod or node is
//! going away, crash handling and switchovers asked for stay: they answer what is happening now.

/// One of the resource's `status.conditions`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OperatorCondition {
    pub type_: String,
    /// `"True"`, `"False"` or `"Unknown"`.
    pub status: String,
    pub observed_generation: Option<i64>,
}

/// Whether the operator is settled: its `Ready` condition is True for the resource's current
/// generation, and it is not `Progressing`. Anything else (no resource, no status, an older
/// generation) is "at work": deferring too long only delays a fail-back, moving too soon fights.
pub fn settled(generation: Option<i64>, conditions: &[OperatorCondition]) -> bool {
    let is = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .filter(|c| c.status == "True")
    };
    let current =
        |c: &OperatorCondition| c.observed_generation.is_none_or(|g| Some(g) == generation);
    is("Ready").is_some_and(current) && is("Progressing").is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(type_: &str, status: &str, gen_: Option<i64>) -> OperatorCondition {
        OperatorCondition {
            type_: type_.into(),
            status: status.into(),
            observed_generation: gen_,
        }
    }

    #[test]
    fn settled_only_when_ready_for_the_current_generation_and_not_progressing() {
        let cases = [
            (vec![c("Ready", "True", Some(3))], true),
            (vec![c("Ready", "True", None)], true),
            (vec![c("Ready", "True", Some(2))], false),
            (vec![c("Ready", "False", Some(3))], false),
            (vec![c("Ready", "Unknown", Some(3))], false),
            (vec![], false),
            (
                vec![
                    c("Ready", "True", Some(3)),
                    c("Progressing", "True", Some(3)),
                ],
                false,
            ),
            (
                vec![
                    c("Ready", "True", Some(3)),
                    c("Progressing", "False", Some(3)),
                ],
                true,
            ),
        ];
        for (conditions, want) in cases {
            assert_eq!(settled(Some(3), &conditions), want, "{conditions:?}");
        }
    }
}

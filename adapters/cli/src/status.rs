//! `leasehold status` and `leasehold raise-fence`.

use std::future::Future;

use leasehold::{Fence, HolderOutcome};
use leasehold_tokio::LockService;

use crate::exit;
use crate::run::fail;
use crate::service::Service;

/// Prints who holds `key`, and who waits for it in line (`waiting`: the fair queue of
/// Redis and etcd, arrival order; read only once the holder query was answered, and
/// shown only when someone waits); exits 0 when it is held, 1 ([`exit::FREE`]) when it
/// is free, 125 when the service refused or did not answer: `if leasehold status k`
/// reads "if k is held". A queue that cannot be read is said on stderr and changes no
/// exit code.
pub async fn status<S: LockService>(
    service: &S,
    key: &str,
    json: bool,
    waiting: impl Future<Output = Result<Vec<leasehold::Identity>, String>>,
) -> u8 {
    if let Err(e) = leasehold::check_key(key) {
        return fail(&format!("{key:?}: {e}"));
    }
    let outcome = LockService::holder(service, key).await;
    let waiting = match outcome {
        HolderOutcome::Held(_) | HolderOutcome::Free => waiting.await.unwrap_or_else(|e| {
            note!("the queue of {key:?} could not be read: {e}");
            Vec::new()
        }),
        _ => Vec::new(),
    };
    let code = holder(key, json, outcome, &waiting);
    if !json && !waiting.is_empty() && code != exit::FAILURE {
        let names: Vec<String> = waiting
            .iter()
            .map(|w| format!("{:?}", w.as_str()))
            .collect();
        out!("waiting in line: {}", names.join(", "));
    }
    code
}

/// The holder line of [`status`], with the queue in the JSON form.
fn holder(key: &str, json: bool, outcome: HolderOutcome, waiting: &[leasehold::Identity]) -> u8 {
    let queue = if waiting.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = waiting.iter().map(|w| json_string(w.as_str())).collect();
        format!(",\"waiting\":[{}]", names.join(","))
    };
    match outcome {
        HolderOutcome::Held(h) if json => {
            out!(
                "{{\"key\":{},\"held\":true,\"holder\":{},\"fence\":{},\"remaining_ms\":{}{queue}}}",
                json_string(key),
                json_string(h.identity.as_str()),
                h.fence.0,
                h.remaining.as_millis()
            );
            0
        }
        HolderOutcome::Held(h) => {
            out!(
                "{key:?} is held by {} (fence {}), {} ms left",
                h.identity,
                h.fence.0,
                h.remaining.as_millis()
            );
            0
        }
        HolderOutcome::Free if json => {
            out!("{{\"key\":{},\"held\":false{queue}}}", json_string(key));
            exit::FREE
        }
        HolderOutcome::Free => {
            out!("{key:?} is free");
            exit::FREE
        }
        HolderOutcome::Refused(why) => fail(&format!("status of {key:?}: {why}")),
        HolderOutcome::Indeterminate(why) => fail(&format!(
            "status of {key:?}: {why}; check that the service is up and reachable"
        )),
        _ => fail(&format!(
            "status of {key:?}: an answer this leasehold does not know"
        )),
    }
}

/// Raises the fence counter of `key`.
pub async fn raise_fence(service: &Service, key: &str, fence: u64) -> u8 {
    let raised = match service {
        Service::Redis(redis) => redis
            .raise_fence(key, Fence(fence))
            .await
            .map_err(|e| e.to_string()),
        Service::Etcd(etcd) => etcd
            .raise_fence(key, Fence(fence))
            .await
            .map_err(|e| e.to_string()),
        Service::Postgres(pg) => pg
            .raise_fence(key, Fence(fence))
            .await
            .map_err(|e| e.to_string()),
    };
    match raised {
        Ok(now) => {
            out!(
                "the fence counter of {key:?} is {}: the next grant gets a larger fence",
                now.0
            );
            0
        }
        Err(e) => fail(&e),
    }
}

/// `text` as a JSON string.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(super::json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}

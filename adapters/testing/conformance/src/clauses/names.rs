//! Keys and identities: the one key rule, refused promptly and finally; everything
//! it allows stored as given.

use leasehold::{
    AcquireOutcome, Fence, HolderOutcome, Identity, Refusal, ReleaseOutcome, RenewOutcome,
    MAX_KEY_LEN,
};
use leasehold_driver::LocalLockService;

use crate::ctx::{ensure, Ctx, Verdict};
use crate::Capabilities;

/// Keys that break [`leasehold::check_key`] — empty, a brace, a control character,
/// longer than 256 bytes — are refused with `Refused(InvalidKey)` by every call,
/// within the request timeout (never `Indeterminate`, never retried by the client).
pub async fn invalid_keys_are_refused<S: LocalLockService>(s: &S, caps: &Capabilities) -> Verdict {
    let ctx = Ctx::new(s, caps, "invalid_keys_are_refused");
    let too_long = ctx.key_of_len(MAX_KEY_LEN + 1, "");
    let keys = [
        String::new(),
        "a{b}".to_owned(),
        "}".to_owned(),
        ctx.key("x{y"),
        ctx.key("line\nbreak"),
        ctx.key("nul\0byte"),
        ctx.key("del\u{7f}"),
        too_long,
    ];
    let refused = Refusal::InvalidKey;
    let (me, token) = (ctx.identity("holder"), ctx.token());
    for key in &keys {
        let acquire = ctx.acquire(key, token, &me, ctx.ttl()).await?;
        let renew = ctx.renew(key, token, Fence(1), ctx.ttl()).await?;
        let release = ctx.release(key, token).await?;
        let holder = ctx.holder(key).await?;
        ensure!(
            ctx,
            acquire == AcquireOutcome::Refused(refused)
                && renew == RenewOutcome::Refused(refused)
                && release == ReleaseOutcome::Refused(refused)
                && holder == HolderOutcome::Refused(refused),
            "invalid key {key:?} ({} bytes): expected Refused(InvalidKey) from every call, \
             got acquire {acquire:?}, renew {renew:?}, release {release:?}, holder {holder:?}",
            key.len()
        );
    }
    Ok(())
}

/// Odd but valid keys — spaces, `/`, `:`, glob and quote characters, non-ASCII,
/// exactly 256 bytes (also ending in a multi-byte character) — work end to end:
/// free, granted, held, contended, renewed, released, free.
pub async fn odd_but_valid_keys_work_end_to_end<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "odd_but_valid_keys_work_end_to_end");
    let keys = [
        ctx.key("with space "),
        ctx.key("a/b/c/"),
        ctx.key("ns:lock:1"),
        ctx.key("*?[glob]"),
        ctx.key("\"quote' \\back%2F%00"),
        ctx.key("ключ-ü-日本-🔒"),
        ctx.key_of_len(MAX_KEY_LEN, "/256"),
        ctx.key_of_len(MAX_KEY_LEN, "/é日"),
    ];
    for key in &keys {
        debug_assert!(leasehold::check_key(key).is_ok(), "{key:?}");
        let (me, token) = (ctx.identity("holder"), ctx.token());
        ctx.free(key, "before any grant").await?;
        let fence = ctx.granted(key, token, &me, ctx.ttl()).await?;
        ctx.held_by(key, &me, fence, ctx.ttl(), "after the grant")
            .await?;
        ctx.held_by_another(key, ctx.token(), &me, fence, ctx.ttl(), "while held")
            .await?;
        ctx.renewed(key, token, fence, ctx.ttl(), "by the holder")
            .await?;
        ctx.release_is(key, token, ReleaseOutcome::Released, "by the holder")
            .await?;
        ctx.free(key, "after the release").await?;
    }
    Ok(())
}

/// Keys are exact names, not prefixes: holding `p` says nothing about `p/`, `p/a`,
/// `pa` or `P`, and releasing one leaves the others held.
pub async fn keys_that_share_a_prefix_are_separate<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "keys_that_share_a_prefix_are_separate");
    let names = ["p", "p/", "p/a", "pa", "P"];
    let me = ctx.identity("holder");
    let mut held = Vec::new();
    for name in names {
        let key = ctx.key(name);
        let token = ctx.token();
        let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
        held.push((key, token, fence));
    }
    let Some((first, token, _)) = held.first() else {
        return Ok(());
    };
    ctx.release_is(first, *token, ReleaseOutcome::Released, "of `p`")
        .await?;
    ctx.free(first, "after its release").await?;
    for (key, _, fence) in held.iter().skip(1) {
        ctx.held_by(key, &me, *fence, ctx.ttl(), "after `p` was released")
            .await?;
    }
    Ok(())
}

/// The holder's identity comes back exactly as given — 64 bytes of ASCII, 64 bytes
/// of 2- and 4-byte characters, punctuation a store might escape, and the empty
/// (anonymous) identity — to contenders and to `holder`.
pub async fn identities_round_trip<S: LocalLockService>(s: &S, caps: &Capabilities) -> Verdict {
    let ctx = Ctx::new(s, caps, "identities_round_trip");
    let texts = [
        "h".repeat(Identity::CAPACITY),
        "é".repeat(Identity::CAPACITY / 2),
        "🔒".repeat(Identity::CAPACITY / 4),
        "{braces} \"quotes\" \\ / : ; % '".to_owned(),
        "host-7:4711".to_owned(),
        String::new(),
    ];
    for (i, text) in texts.iter().enumerate() {
        let identity = Identity::new(text)
            .map_err(|e| ctx.violation(format!("test identity {text:?}: {e}")))?;
        let key = ctx.key(&format!("id{i}"));
        let fence = ctx.granted(&key, ctx.token(), &identity, ctx.ttl()).await?;
        let why = format!("for identity {i}");
        ctx.held_by_another(&key, ctx.token(), &identity, fence, ctx.ttl(), &why)
            .await?;
        ctx.held_by(&key, &identity, fence, ctx.ttl(), &why).await?;
    }
    Ok(())
}

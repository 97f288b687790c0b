//! A request bounded by the request timeout: [`Bounded`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use crate::error::{Op, RedisLockError};

pin_project_lite::pin_project! {
    /// `call`, or [`RedisLockError::Timeout`] once `after` has passed since its first
    /// poll.
    ///
    /// `tokio::time::timeout` needs a runtime when it is made, and a timeout made at
    /// the first poll by a future around it moves the call into place once more on
    /// every request. This future makes its timer in place at its first poll: a
    /// request made outside the runtime can run inside it, and the call is never
    /// moved once polled.
    pub(crate) struct Bounded<'e, F> {
        #[pin]
        call: F,
        #[pin]
        timer: Option<Sleep>,
        after: Duration,
        op: Op,
        // `host:port`, for the error.
        endpoint: &'e str,
    }
}

impl<'e, F> Bounded<'e, F> {
    pub(crate) fn new(call: F, after: Duration, op: Op, endpoint: &'e str) -> Self {
        Bounded {
            call,
            timer: None,
            after,
            op,
            endpoint,
        }
    }
}

impl<T, F> Future for Bounded<'_, F>
where
    F: Future<Output = Result<T, RedisLockError>>,
{
    type Output = Result<T, RedisLockError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if this.timer.is_none() {
            this.timer.set(Some(tokio::time::sleep(*this.after)));
        }
        // The answer first: one that is in when the time runs out still counts.
        if let Poll::Ready(answer) = this.call.poll(cx) {
            return Poll::Ready(answer);
        }
        match this.timer.as_pin_mut().map(|timer| timer.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(RedisLockError::Timeout {
                op: *this.op,
                endpoint: (*this.endpoint).to_owned(),
                after: *this.after,
            })),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded<T>(
        call: impl Future<Output = Result<T, RedisLockError>>,
    ) -> Bounded<'static, impl Future<Output = Result<T, RedisLockError>>> {
        Bounded::new(call, Duration::from_millis(100), Op::Renew, "redis:6379")
    }

    /// The bound counts from the first poll, not from when the request was made: a
    /// request made and then left unpolled for longer than the bound still runs.
    #[tokio::test(start_paused = true)]
    async fn the_bound_counts_from_the_first_poll() {
        let request = bounded(async {
            tokio::time::sleep(Duration::from_millis(60)).await;
            Ok(7)
        });
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(request.await.ok(), Some(7));
    }

    /// A call that does not answer within the bound is a timeout, naming the request,
    /// where it went and the bound.
    #[tokio::test(start_paused = true)]
    async fn a_call_without_an_answer_in_time_is_a_timeout() {
        let started = tokio::time::Instant::now();
        let answer = bounded(std::future::pending::<Result<(), RedisLockError>>()).await;
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        match answer {
            Err(RedisLockError::Timeout {
                op,
                endpoint,
                after,
            }) => {
                assert_eq!((op, endpoint.as_str()), (Op::Renew, "redis:6379"));
                assert_eq!(after, Duration::from_millis(100));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    /// An answer that is in at the instant the bound runs out counts.
    #[tokio::test(start_paused = true)]
    async fn an_answer_in_at_the_bound_counts() {
        let answer = bounded(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(1)
        });
        assert_eq!(answer.await.ok(), Some(1));
    }
}

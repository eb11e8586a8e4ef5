//! A spawned task owned by a value: aborted when the value is dropped, so it never outlives what
//! started it (a keeper's watch of its shard's members, a coordinator term's formation round).

use tokio::task::{JoinError, JoinHandle};

/// The task, aborted on drop.
pub struct Owned<T>(JoinHandle<T>);

impl<T: Send + 'static> Owned<T> {
    pub fn spawn(task: impl Future<Output = T> + Send + 'static) -> Self {
        Owned(tokio::spawn(task))
    }

    /// Waits for the task's end; an error if it panicked.
    pub async fn join(&mut self) -> Result<T, JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

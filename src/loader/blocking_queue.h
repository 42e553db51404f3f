// A closable multi-producer/multi-consumer queue: the hand-off between reader threads and the
// copy engine. Close() wakes every waiter at once, which is how an error or a cancel on any
// thread stops all the others without them polling.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace zckpt::loader {

template <typename T>
class BlockingQueue {
 public:
  // False (and the item dropped) once closed.
  bool Push(T item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return false;
      items_.push_back(std::move(item));
    }
    ready_.notify_one();
    return true;
  }

  // Waits for an item; nullopt once closed (pending items are abandoned: closing means stop).
  std::optional<T> Pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return closed_ || !items_.empty(); });
    return TakeLocked();
  }

  std::optional<T> TryPop() {
    std::lock_guard<std::mutex> lock(mutex_);
    return TakeLocked();
  }

  void Close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }

 private:
  std::optional<T> TakeLocked() {
    if (closed_ || items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
  bool closed_ = false;
};

}  // namespace zckpt::loader

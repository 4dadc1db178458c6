// A C++ frame pipeline instrumented with loopscope: a producer thread hands
// frames to a consumer through a queue; each frame's wait in the queue and
// its processing are logged as intervals, tagged with the frame number.
// A small RAII type closes an interval at the end of a scope.
//
//   g++ -std=c++17 frames.cpp $(loopscope-config --cflags --libs) -o frames
//   ./frames frames.lstrace 2000
//   loopscope trace dump frames.lstrace --limit 10
#include <loopscope.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

namespace {

// Logs [construction, destruction) as one interval of `e`.
class Span {
  public:
    Span(const ls_entity *e, uint32_t tag) : e_(e), tag_(tag), t0_(ls_now()) {}
    ~Span() { ls_interval(e_, tag_, t0_); }
    Span(const Span &) = delete;
    Span &operator=(const Span &) = delete;

  private:
    const ls_entity *e_;
    uint32_t tag_;
    uint64_t t0_;
};

struct Frame {
    uint32_t n;
    uint64_t queued;  // ls_now() when it entered the queue
};

}  // namespace

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : nullptr;
    const uint32_t frames = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 1000;
    if (ls_open(path, nullptr) != 0) {
        std::fprintf(stderr, "frames: %s\n", ls_last_error());
        return 1;
    }
    const ls_entity *queued = ls_register("frames", "queued", LS_KIND_INTERVAL, "a frame's wait in the queue");
    const ls_entity *process = ls_register("frames", "process", LS_KIND_INTERVAL, "processing one frame");
    std::deque<Frame> q;
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::thread consumer([&] {
        ls_thread_init();
        for (;;) {
            std::unique_lock<std::mutex> lk(m);
            cv.wait(lk, [&] { return !q.empty() || done; });
            if (q.empty()) return;
            Frame f = q.front();
            q.pop_front();
            lk.unlock();
            ls_interval(queued, f.n, f.queued);
            Span s(process, f.n);
            volatile double x = 0;
            for (int i = 0; i < 2000; i++) x = x + i * 0.5;
        }
    });
    ls_thread_init();
    for (uint32_t n = 0; n < frames; n++) {
        {
            std::lock_guard<std::mutex> lk(m);
            q.push_back(Frame{n, ls_now()});
        }
        cv.notify_one();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    {
        std::lock_guard<std::mutex> lk(m);
        done = true;
    }
    cv.notify_one();
    consumer.join();
    if (ls_close() != 0) {
        std::fprintf(stderr, "frames: %s\n", ls_last_error());
        return 1;
    }
    std::printf("%u frames\n", frames);
    return 0;
}

// The emulator's CUDA threads (tests/kernels/emu/cuda_runtime.h): one block's threads run as
// fibers on the calling host thread, switched only at barriers, so a shuffle costs a few
// context switches instead of waking 32 OS threads. A scheduling pass runs the warps one after
// another, each until every lane waits at a block barrier or has exited (its shuffles in
// between), lanes in the warp's order; each pass takes the warps and lanes in ascending or
// descending order (a fixed pseudo-random sequence). So between two block barriers each warp
// runs all its work before or after each other warp, and a missing barrier between a writer
// in one warp and a reader in another shows in one of the two orders.
// Exited threads count as arrived at every barrier (as on the GPU).
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_runtime.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace emu {
namespace {

constexpr size_t kStackBytes = 256 << 10;  // per fiber; mmap'd, touched pages only
enum State { kReady, kAtWarpBarrier, kAtBlockBarrier, kAtClusterBarrier, kDone };

struct Fiber {
    State state = kDone;
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t ctx;
#endif
};

std::vector<Fiber> fibers;
std::vector<unsigned char *> stacks;
#if defined(__x86_64__)
void *scheduler_sp = nullptr;
#else
ucontext_t scheduler_ctx;
#endif
const std::function<void()> *body = nullptr;
int current = -1;
int at_cluster = 0, done = 0;
std::vector<int> at_warp, done_in_warp, at_block, done_in_block;  // per warp, per block of the cluster

}  // namespace
}  // namespace emu

#if defined(__x86_64__)
// emu_switch(save, next): saves the callee-saved registers on this stack, stores the stack
// pointer in *save and resumes the context whose pointer is next. The floating-point control
// state (MXCSR, x87 control word) is the host thread's, shared by every fiber: no kernel sets it.
extern "C" void emu_switch(void **save, void *next);
asm(R"(
    .text
    .p2align 4
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");
#endif

namespace emu {
namespace {

[[noreturn]] void fiber_main() {
    (*body)();
    fibers[current].state = kDone;
    ++done;
    ++done_in_warp[current / kWarp];
    ++done_in_block[current / bDim.x];
#if defined(__x86_64__)
    emu_switch(&fibers[current].sp, scheduler_sp);
#else
    swapcontext(&fibers[current].ctx, &scheduler_ctx);
#endif
    std::abort();  // a finished fiber is never resumed
}

void start_fiber(int t) {
    // Stack tops staggered by 832 bytes a fiber: equally aligned tops would share cache sets.
    unsigned char *top = stacks[t] + kStackBytes - (t % 64) * 832;
#if defined(__x86_64__)
    // The frame emu_switch pops: six registers, then fiber_main as the return address (entered
    // with the stack 8 mod 16, as after a call).
    void **sp = reinterpret_cast<void **>(top) - 2;
    sp[0] = reinterpret_cast<void *>(&fiber_main);
    sp[1] = nullptr;
    sp -= 6;
    for (int i = 0; i < 6; ++i) sp[i] = nullptr;
    fibers[t].sp = sp;
#else
    getcontext(&fibers[t].ctx);
    fibers[t].ctx.uc_stack.ss_sp = stacks[t];
    fibers[t].ctx.uc_stack.ss_size = kStackBytes;
    fibers[t].ctx.uc_link = nullptr;
    makecontext(&fibers[t].ctx, fiber_main, 0);
#endif
    fibers[t].state = kReady;
}

void resume(int t) {
    current = t;
    tIdx = dim3((unsigned)t % bDim.x);
    bIdx = cluster_first;
    bIdx.z += (unsigned)t / bDim.x;
#if defined(__x86_64__)
    emu_switch(&scheduler_sp, fibers[t].sp);
#else
    swapcontext(&scheduler_ctx, &fibers[t].ctx);
#endif
    current = -1;
}

void yield() {
#if defined(__x86_64__)
    emu_switch(&fibers[current].sp, scheduler_sp);
#else
    swapcontext(&fibers[current].ctx, &scheduler_ctx);
#endif
}

void release(State waiting, int first, int count) {
    for (int t = first; t < first + count; ++t)
        if (fibers[t].state == waiting) fibers[t].state = kReady;
}

}  // namespace

int fiber() { return current; }

void block_barrier() {
    const int b = current / (int)bDim.x;
    fibers[current].state = kAtBlockBarrier;
    if (++at_block[b] + done_in_block[b] == (int)bDim.x) {
        at_block[b] = 0;
        release(kAtBlockBarrier, b * (int)bDim.x, (int)bDim.x);
    }
    yield();
}

void cluster_barrier() {
    fibers[current].state = kAtClusterBarrier;
    if (++at_cluster + done == (int)fibers.size()) {
        at_cluster = 0;
        release(kAtClusterBarrier, 0, (int)fibers.size());
    }
    yield();
}

void warp_barrier() {
    const int w = current / kWarp;
    fibers[current].state = kAtWarpBarrier;
    if (++at_warp[w] + done_in_warp[w] == kWarp) {
        at_warp[w] = 0;
        release(kAtWarpBarrier, w * kWarp, kWarp);
    }
    yield();
}

void run_block(unsigned n_threads, const std::function<void()> &kernel_body) {
    if (n_threads % kWarp != 0) {
        std::fprintf(stderr, "emu: %u threads is not whole warps\n", n_threads);
        std::abort();
    }
    while (stacks.size() < n_threads) {
        void *s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (s == MAP_FAILED) std::abort();
        stacks.push_back(static_cast<unsigned char *>(s));
    }
    fibers.assign(n_threads, Fiber{});
    at_warp.assign(n_threads / kWarp, 0);
    done_in_warp.assign(n_threads / kWarp, 0);
    at_block.assign(n_threads / bDim.x, 0);
    done_in_block.assign(n_threads / bDim.x, 0);
    at_cluster = done = 0;
    body = &kernel_body;
    for (unsigned t = 0; t < n_threads; ++t) start_fiber((int)t);
    uint32_t order = 0x9e3779b9u;  // xorshift32: the direction of each pass
    const int n_warps = (int)n_threads / kWarp;
    while (done < (int)n_threads) {
        order ^= order << 13; order ^= order >> 17; order ^= order << 5;
        const bool ascending = order & 1;
        bool ran = false;
        for (int i = 0; i < n_warps; ++i) {
            const int w = ascending ? i : n_warps - 1 - i;
            for (bool ready = true; ready;) {  // the warp's lanes until none is ready
                ready = false;
                for (int j = 0; j < kWarp; ++j) {
                    const int t = w * kWarp + (ascending ? j : kWarp - 1 - j);
                    if (fibers[t].state != kReady) continue;
                    resume(t);
                    ran = ready = true;
                }
            }
        }
        if (!ran) {
            std::fprintf(stderr, "emu: every live thread waits at a barrier the others never reach\n");
            std::abort();
        }
    }
    body = nullptr;
}

}  // namespace emu

// Tests read which configuration a launch took by its shared memory.
extern "C" size_t emu_last_launch_smem() { return emu::last_launch_smem; }
extern "C" size_t emu_launches() { return emu::launches; }
extern "C" unsigned emu_last_launch_cluster() { return emu::last_launch_cluster; }

#include "profiler/cupti_tracer.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <stdexcept>

#include "kernels/common/cuda_check.h"

namespace lcplan::profiler {

std::atomic<CuptiTracer*> CuptiTracer::live_{nullptr};

namespace {

// The activity kinds the profile reads (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL keeps kernels concurrent, unlike KERNEL).
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
// Tags: CUPTI writes an external correlation record per API activity record, so the API kinds must be on too
// (cupti_activity.h, cuptiActivityPushExternalCorrelationId); NCCL and cuBLAS launch through both APIs.
constexpr CUpti_ActivityKind kTagKinds[] = {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME,
                                            CUPTI_ACTIVITY_KIND_DRIVER};
// The external-correlation kind the tags use (CUSTOM0: reserved for the application).
constexpr CUpti_ExternalCorrelationKind kTagKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
// CUPTI wants 8-byte aligned buffers (cupti_activity.h, CUpti_BuffersCallbackRequestFunc).
constexpr size_t kAlign = 8;

}  // namespace

CuptiTracer::CuptiTracer(size_t buffer_bytes, Tags tags)
    : buffer_bytes_((buffer_bytes + kAlign - 1) / kAlign * kAlign) {
  CuptiTracer* expected = nullptr;
  if (!live_.compare_exchange_strong(expected, this))
    throw std::runtime_error("a CUPTI tracer is already live in this process (CUPTI activity is process-wide)");
  try {
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(&CuptiTracer::on_request, &CuptiTracer::on_complete));
    std::vector<CUpti_ActivityKind> want(std::begin(kKinds), std::end(kKinds));
    if (tags == Tags::On) want.insert(want.end(), std::begin(kTagKinds), std::end(kTagKinds));
    for (CUpti_ActivityKind k : want) {
      CUPTI_CHECK(cuptiActivityEnable(k));
      kinds_.push_back(k);  // only what was enabled is disabled again
    }
    tags_on_ = tags == Tags::On;
  } catch (...) {
    for (CUpti_ActivityKind k : kinds_) cuptiActivityDisable(k);
    live_.store(nullptr);
    throw;
  }
}

CuptiTracer::~CuptiTracer() {
  auto log = [](CUptiResult st, const char* what) {
    if (st == CUPTI_SUCCESS) return;
    const char* msg = nullptr;
    cuptiGetResultString(st, &msg);
    ::lcplan::gpu::log_failure(what, msg ? msg : "unknown CUPTI error", __FILE__, __LINE__);
  };
  log(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  for (CUpti_ActivityKind k : kinds_) log(cuptiActivityDisable(k), "cuptiActivityDisable");
  live_.store(nullptr);  // later buffers are freed unread (on_complete finds no tracer)
}

void CUPTIAPI CuptiTracer::on_request(uint8_t** buffer, size_t* size, size_t* max_records) {
  CuptiTracer* t = live_.load();
  const size_t bytes = t ? t->buffer_bytes_ : (size_t(1) << 20);
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes));
  *size = *buffer ? bytes : 0;  // a null buffer makes CUPTI drop records, which the drop count reports
  *max_records = 0;             // as many as fit
}

void CUPTIAPI CuptiTracer::on_complete(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  CuptiTracer* t = live_.load();
  if (t) {
    size_t dropped = 0;
    const CUptiResult st = cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
    t->complete(buffer, valid, dropped, st == CUPTI_SUCCESS ? "" : "cuptiActivityGetNumDroppedRecords failed");
  }
  std::free(buffer);
}

void CuptiTracer::complete(uint8_t* buffer, size_t valid, size_t dropped, std::string err) {
  ActivityBuffer out;
  out.dropped = dropped;
  CUpti_Activity* rec = nullptr;
  for (;;) {
    const CUptiResult st = cuptiActivityGetNextRecord(buffer, valid, &rec);
    if (st == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of the valid records
    if (st != CUPTI_SUCCESS) {
      const char* msg = nullptr;
      cuptiGetResultString(st, &msg);
      if (err.empty()) err = std::string("cuptiActivityGetNextRecord failed: ") + (msg ? msg : "unknown CUPTI error");
      break;
    }
    // Record layouts of this CUPTI (cupti_activity.h): CUpti_ActivityKernel10, Memcpy6, Memset4,
    // ExternalCorrelation; API records (RUNTIME, DRIVER) are read only through the external correlations.
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        out.records.push_back({ActivityKind::Kernel, k->deviceId, k->streamId, k->start, k->end, 0,
                               k->name ? k->name : "", k->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        out.records.push_back(
            {ActivityKind::Memcpy, m->deviceId, m->streamId, m->start, m->end, m->bytes, "", m->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        out.records.push_back(
            {ActivityKind::Memset, m->deviceId, m->streamId, m->start, m->end, m->bytes, "", m->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const auto* x = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(rec);
        if (x->externalKind == kTagKind) out.tags.push_back({x->correlationId, x->externalId});
        break;
      }
      default: break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!err.empty() && error_.empty()) error_ = err;
  done_.push_back(std::move(out));
}

std::vector<ActivityBuffer> CuptiTracer::take() {
  CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw std::runtime_error("CUPTI tracer: " + error_);
  std::vector<ActivityBuffer> out;
  out.swap(done_);
  return out;
}

uint32_t CuptiTracer::stream_id(cudaStream_t s) const {
  uint32_t id = 0;
  // A null context: CUPTI looks the stream up in its own context (cupti_activity.h, cuptiGetStreamIdEx).
  CUPTI_CHECK(cuptiGetStreamIdEx(nullptr, reinterpret_cast<CUstream>(s), 0, &id));
  return id;
}

void CuptiTracer::push_tag(uint64_t tag) {
  if (!tags_on_) throw std::logic_error("CUPTI tracer: push_tag needs a tracer built with Tags::On");
  CUPTI_CHECK(cuptiActivityPushExternalCorrelationId(kTagKind, tag));
}

void CuptiTracer::pop_tag() {
  if (!tags_on_) throw std::logic_error("CUPTI tracer: pop_tag needs a tracer built with Tags::On");
  uint64_t last = 0;
  CUPTI_CHECK(cuptiActivityPopExternalCorrelationId(kTagKind, &last));
}

}  // namespace lcplan::profiler

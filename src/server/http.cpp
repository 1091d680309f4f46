// The HTTP layer on libmicrohttpd (Debian's libmicrohttpd-dev): one event thread serves every connection, so an idle,
// slow or hostile client costs a socket and a little memory, never a thread. Not a parser of HTTP: the library is.
//
// Threads, and what each does:
// - the event thread (the library's) runs every callback: it reads requests, answers quick routes itself, queues
//   answers and writes streams. It never waits: a request that needs work goes to a worker while its connection is
//   suspended, and a job's answer is written as its events come.
// - workers (HttpConfig::workers) parse request bodies, render templates and tokenize prompts (milliseconds; seconds
//   for a huge prompt), then leave an answer or submit a job, and wake the connection.
// - the scheduler thread pushes a job's events; the job channel's listener wakes the connection.
// - the supervisor (every 100 ms) closes connections that have not sent a whole request within read_timeout_s of
//   opening or of their last answer, notices clients that left while their answer waits (and cancels the job), and
//   asks silent streams for a keep-alive comment.
// - run()'s thread waits for SIGTERM/SIGINT and shuts down.
//
// One request and its answer is an Exchange, guarded by its mutex. Only the event thread suspends a connection, with
// that mutex held and after finding nothing to do; whoever gives it something to do (a worker, the listener, the
// supervisor) does so under the mutex and resumes the connection if it is suspended. So every suspension has exactly
// one resume and no wake-up is lost (the library forbids resuming a connection that is not suspended). Once the
// library reports the request finished (`finished`), nobody touches its connection again; the library closes a
// socket only after that report, so the supervisor may look at the socket while it holds the mutex of an unfinished
// exchange.
#include "server/http.h"

#include <microhttpd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "core/error.h"
#include "server/connection.h"
#include "server/endpoints.h"
#include "server/webpage.h"

namespace strata::server {

using Clock = std::chrono::steady_clock;

namespace {

// Silence after which a stream gets a comment line, for proxies that close connections they think idle.
constexpr auto kStreamKeepAlive = std::chrono::seconds(15);
constexpr auto kSupervisorPeriod = std::chrono::milliseconds(100);
// How long finished answers (error events, [DONE]) may take to go out at shutdown.
constexpr auto kFlushAtShutdown = std::chrono::seconds(5);

enum class RouteKind {
    Health, Page, Metrics, Models, Props, Slots,  // GET, answered on the event thread
    Chat, Completion, Responses, Messages, CountTokens, Infill, Tokenize, Detokenize, ApplyTemplate  // POST
};

struct Route {
    const char *path;
    RouteKind kind;
    bool post;
    bool open;  // needs no API key
    ApiFamily family;
};

// The /v1 paths also answer without the prefix, as OpenAI clients configured either way expect.
const Route kRoutes[] = {
    {"/health", RouteKind::Health, false, true, ApiFamily::OpenAI},
    {"/", RouteKind::Page, false, true, ApiFamily::OpenAI},
    {"/metrics", RouteKind::Metrics, false, false, ApiFamily::OpenAI},
    {"/v1/models", RouteKind::Models, false, false, ApiFamily::OpenAI},
    {"/models", RouteKind::Models, false, false, ApiFamily::OpenAI},
    {"/props", RouteKind::Props, false, false, ApiFamily::OpenAI},
    {"/slots", RouteKind::Slots, false, false, ApiFamily::OpenAI},
    {"/v1/chat/completions", RouteKind::Chat, true, false, ApiFamily::OpenAI},
    {"/chat/completions", RouteKind::Chat, true, false, ApiFamily::OpenAI},
    {"/v1/completions", RouteKind::Completion, true, false, ApiFamily::OpenAI},
    {"/completions", RouteKind::Completion, true, false, ApiFamily::OpenAI},
    {"/v1/responses", RouteKind::Responses, true, false, ApiFamily::OpenAI},
    {"/responses", RouteKind::Responses, true, false, ApiFamily::OpenAI},
    {"/v1/messages", RouteKind::Messages, true, false, ApiFamily::Anthropic},
    {"/messages", RouteKind::Messages, true, false, ApiFamily::Anthropic},
    {"/v1/messages/count_tokens", RouteKind::CountTokens, true, false, ApiFamily::Anthropic},
    {"/infill", RouteKind::Infill, true, false, ApiFamily::OpenAI},
    {"/tokenize", RouteKind::Tokenize, true, false, ApiFamily::OpenAI},
    {"/detokenize", RouteKind::Detokenize, true, false, ApiFamily::OpenAI},
    {"/apply-template", RouteKind::ApplyTemplate, true, false, ApiFamily::OpenAI},
};

const Route *find_route(const std::string &path) {
    for (const Route &r : kRoutes)
        if (path == r.path) return &r;
    return nullptr;
}

// One TCP connection (the library's socket context).
struct Conn {
    int fd = -1;
    Clock::time_point read_since;  // when it began waiting for its next request
    bool reading = true;           // a request (headers or body) is awaited
    bool refused = false;          // opened past max_connections: its request gets 503
    bool timed_out = false;
    int n_requests = 0;
};

struct Exchange {
    enum class State { Reading, Preparing, Waiting, Streaming, Answered };

    MHD_Connection *mhd = nullptr;
    std::weak_ptr<Exchange> self;
    Conn *conn = nullptr;
    const Route *route = nullptr;
    std::string label;  // for /metrics: the route's path, or "unknown"
    ApiFamily family = ApiFamily::OpenAI;
    std::string body;   // written by the event thread while Reading, then read by one worker
    bool oversize = false;  // over max_body: the rest is read and dropped, and the answer is 413
    bool close_after = false;

    std::mutex mu;  // guards everything below
    State state = State::Reading;
    bool suspended = false, finished = false, gone = false, keepalive_due = false;
    std::optional<Answer> answer;
    std::shared_ptr<Job> job;
    std::unique_ptr<Reply> reply;
    bool stream = false, stream_ended = false;
    std::string out;  // stream bytes not yet handed to the library
    size_t out_pos = 0;
    Clock::time_point last_write;
    int status = 0;
};

// Held by the event thread only, with ex.mu: nothing to do until someone wakes it.
void suspend(Exchange &ex) {
    ex.suspended = true;
    MHD_suspend_connection(ex.mhd);
}

// Held with ex.mu by whoever just gave the exchange something to do.
void wake(Exchange &ex) {
    if (ex.suspended && !ex.finished) {
        ex.suspended = false;
        MHD_resume_connection(ex.mhd);
    }
}

std::string lower(std::string s) {
    for (char &c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string header(MHD_Connection *c, const char *name) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
    return v ? v : "";
}

// A fixed pool of threads running tasks in order.
class Workers {
public:
    explicit Workers(int n) {
        for (int i = 0; i < std::max(n, 1); i++) threads_.emplace_back([this] { loop(); });
    }
    ~Workers() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto &t : threads_) t.join();
    }
    void post(std::function<void()> task) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            tasks_.push_back(std::move(task));
        }
        cv_.notify_one();
    }

private:
    void loop() {
        for (;;) {
            std::function<void()> task;
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
                if (tasks_.empty()) return;
                task = std::move(tasks_.front());
                tasks_.pop_front();
            }
            task();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> tasks_;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

// A listening socket on host:port without SO_REUSEPORT, so a port another process listens on is an error here
// rather than a port the kernel splits between two servers.
int listen_on(const std::string &host, int port, int &bound_port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo *res = nullptr;
    const std::string service = std::to_string(port);
    if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res); rc != 0)
        fail("cannot listen on %s:%d: %s", host.c_str(), port, gai_strerror(rc));
    std::string why = "no address";
    int fd = -1;
    for (addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            why = std::strerror(errno);
            continue;
        }
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restarts despite TIME_WAIT; not sharing
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
        why = std::strerror(errno);
        if (errno == EADDRINUSE) why += " (another process listens there)";
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) fail("cannot listen on %s:%d: %s", host.c_str(), port, why.c_str());
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len);
    bound_port = sa.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6 &>(sa).sin6_port)
                                          : ntohs(reinterpret_cast<sockaddr_in &>(sa).sin_port);
    return fd;
}

void mhd_log(void *, const char *fmt, va_list ap) {
    // The library's notes on bad clients (malformed requests, resets) are theirs, not the server's: only with
    // STRATA_HTTP_LOG=1.
    static const bool on = [] {
        const char *v = std::getenv("STRATA_HTTP_LOG");
        return v && std::strcmp(v, "1") == 0;
    }();
    if (!on) return;
    std::fputs("strata: http: ", stderr);
    std::vfprintf(stderr, fmt, ap);
}

}  // namespace

struct HttpServer::Impl {
    HttpConfig cfg;
    Endpoints &ep;
    Scheduler &sched;
    int listen_fd = -1, port = 0;
    MHD_Daemon *daemon = nullptr;
    std::unique_ptr<Workers> workers;

    std::mutex mu;  // guards conns, exchanges, stats, shutting_down, the Conn fields
    std::set<Conn *> conns;
    std::set<std::shared_ptr<Exchange>> exchanges;  // unfinished, past Reading
    int64_t n_unfinished = 0;                       // exchanges begun and not yet finished
    int64_t n_serving = 0;                          // connections not refused
    HttpStats stats;
    bool shutting_down = false;

    std::thread supervisor;
    std::mutex sup_mu;
    std::condition_variable sup_cv;
    bool sup_stop = false;

    Impl(HttpConfig c, Endpoints &e, Scheduler &s) : cfg(std::move(c)), ep(e), sched(s) {}

    // ---- the library's callbacks (event thread) ------------------------------------------------------------------

    void on_connection(MHD_Connection *c, void **socket_context, MHD_ConnectionNotificationCode code) {
        if (code == MHD_CONNECTION_NOTIFY_STARTED) {
            auto *conn = new Conn;
            const MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
            conn->fd = info ? info->connect_fd : -1;
            // Answers go out as soon as written: no Nagle wait for the ACK the client delays (40 ms).
            const int one = 1;
            if (conn->fd >= 0) setsockopt(conn->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            conn->read_since = Clock::now();
            std::lock_guard<std::mutex> lock(mu);
            conn->refused = n_serving >= cfg.max_connections;
            if (!conn->refused) n_serving++;
            conns.insert(conn);
            stats.connections_open++;
            *socket_context = conn;
        } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
            auto *conn = static_cast<Conn *>(*socket_context);
            if (!conn) return;
            std::lock_guard<std::mutex> lock(mu);
            if (!conn->refused) n_serving--;
            conns.erase(conn);
            stats.connections_open--;
            delete conn;
            *socket_context = nullptr;
        }
    }

    MHD_Result on_request(MHD_Connection *c, const char *url, const char *method, const char *upload,
                          size_t *upload_size, void **con_cls) {
        if (!*con_cls) {
            auto ex = std::make_shared<Exchange>();
            ex->self = ex;
            ex->mhd = c;
            const MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
            ex->conn = info ? static_cast<Conn *>(info->socket_context) : nullptr;
            *con_cls = new std::shared_ptr<Exchange>(ex);
            std::optional<Answer> early = admit(*ex, c, url, method);
            if (early) {
                // Answered before the body is read: the library sends it and closes the connection.
                std::lock_guard<std::mutex> lock(ex->mu);
                return queue(*ex, *early);
            }
            return MHD_YES;
        }
        Exchange &ex = **static_cast<std::shared_ptr<Exchange> *>(*con_cls);
        if (*upload_size > 0) {
            std::lock_guard<std::mutex> lock(ex.mu);
            if (ex.state == Exchange::State::Reading && !ex.oversize) {
                if (ex.body.size() + *upload_size > cfg.max_body) {
                    ex.oversize = true;
                    std::string().swap(ex.body);
                } else {
                    ex.body.append(upload, *upload_size);
                }
            }
            *upload_size = 0;
            return MHD_YES;
        }
        std::unique_lock<std::mutex> lock(ex.mu);
        if (ex.state == Exchange::State::Reading) {
            {
                std::lock_guard<std::mutex> g(mu);
                if (ex.conn) ex.conn->reading = false;
            }
            return dispatch(ex, lock);
        }
        return proceed(ex);
    }

    void on_completed(void **con_cls, MHD_RequestTerminationCode toe) {
        auto *holder = static_cast<std::shared_ptr<Exchange> *>(*con_cls);
        if (!holder) return;
        std::shared_ptr<Exchange> ex = *holder;
        delete holder;
        *con_cls = nullptr;
        int status;
        {
            std::lock_guard<std::mutex> lock(ex->mu);
            ex->finished = true;
            if (ex->job && !ex->job->finished) {  // the client went away before the end: free the slot
                ex->job->cancelled = true;
                sched.notify();
            }
            // A client that left before its answer was ready: nginx's "client closed request" (it never reads it).
            status = ex->status != 0 ? ex->status : 499;
        }
        (void)toe;
        std::lock_guard<std::mutex> lock(mu);
        if (!ex->label.empty()) stats.requests[{ex->label, status}]++;
        exchanges.erase(ex);
        n_unfinished--;
        if (ex->conn) {
            ex->conn->reading = true;
            ex->conn->read_since = Clock::now();
        }
    }

    // The stream of a job being answered: bytes as its events come; suspended while there are none.
    ssize_t read_stream(Exchange &ex, char *buf, size_t max) {
        std::lock_guard<std::mutex> lock(ex.mu);
        if (ex.out_pos >= ex.out.size() && !ex.stream_ended && !ex.gone) {
            ex.out.clear();
            ex.out_pos = 0;
            for (Event e; !ex.stream_ended && ex.job->out.pop(e, std::chrono::milliseconds(0));) {
                if (e.kind == Event::Kind::Error) {
                    ex.out += ex.reply->stream_error(job_error(e));
                    ex.stream_ended = true;
                } else {
                    ex.out += ex.reply->stream(e);
                    ex.stream_ended = e.kind == Event::Kind::Done;
                }
            }
            if (ex.out.empty() && ex.keepalive_due) ex.out = ": keep-alive\n\n";
            ex.keepalive_due = false;
        }
        if (ex.out_pos < ex.out.size()) {
            const size_t n = std::min(max, ex.out.size() - ex.out_pos);
            std::memcpy(buf, ex.out.data() + ex.out_pos, n);
            ex.out_pos += n;
            ex.last_write = Clock::now();
            return ssize_t(n);
        }
        if (ex.gone) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (ex.stream_ended) return MHD_CONTENT_READER_END_OF_STREAM;
        suspend(ex);
        return 0;
    }

    // ---- requests ------------------------------------------------------------------------------------------------

    Answer too_large(ApiFamily family) const {
        return error_answer(family, ApiError(413,
                                             strfmt("The request body is too large: at most %zu bytes (--max-body).",
                                                    cfg.max_body),
                                             "invalid_request_error", {}, "request_too_large"));
    }

    bool authorized(MHD_Connection *c) const {
        if (cfg.api_key.empty()) return true;
        return header(c, "Authorization") == "Bearer " + cfg.api_key || header(c, "x-api-key") == cfg.api_key;
    }

    // What can be told from the request line and headers alone: an answer now, or nothing (read the body).
    std::optional<Answer> admit(Exchange &ex, MHD_Connection *c, const std::string &url, const std::string &method) {
        const std::string path = url.substr(0, url.find('?'));
        ex.route = find_route(path);
        ex.label = ex.route ? ex.route->path : "unknown";
        ex.family = ex.route ? ex.route->family : ApiFamily::OpenAI;
        bool shutting, refused;
        {
            std::lock_guard<std::mutex> lock(mu);
            shutting = shutting_down;
            refused = ex.conn && ex.conn->refused;
            if (ex.conn && ++ex.conn->n_requests >= cfg.keep_alive_requests) ex.close_after = true;
            if (refused) stats.connections_refused++;
            n_unfinished++;
        }
        auto fail_with = [&](int status, std::string msg, const char *type, const char *code) {
            Answer a = error_answer(ex.family, ApiError(status, std::move(msg), type, {}, code));
            ex.close_after = ex.close_after || status == 503;
            return a;
        };
        if (shutting)
            return fail_with(503, "The server is shutting down. Retry later.", "server_error", "shutting_down");
        if (refused)
            return fail_with(503,
                             strfmt("The server has too many open connections (%d, --max-connections). Retry later.",
                                    cfg.max_connections),
                             "server_error", "too_many_connections");
        // Unknown URLs need the key too: what is there is not told to anyone without it.
        if ((!ex.route || !ex.route->open) && !authorized(c)) {
            Answer a = fail_with(401, "Incorrect API key provided. Pass it as 'Authorization: Bearer KEY'.",
                                 "invalid_request_error", "invalid_api_key");
            return a;
        }
        if (!ex.route) return fail_with(404, "Unknown request URL: " + method + " " + path + ".",
                                        "invalid_request_error", "unknown_url");
        const bool get = method == "GET" || method == "HEAD";
        if (ex.route->post ? method != "POST" : !get) {
            Answer a = fail_with(405, strfmt("%s %s is not allowed: use %s.", method.c_str(), path.c_str(),
                                             ex.route->post ? "POST" : "GET"),
                                 "invalid_request_error", "method_not_allowed");
            a.headers.emplace_back("Allow", ex.route->post ? "POST" : "GET, HEAD");
            return a;
        }
        if (ex.route->post) {
            const std::string type = lower(header(c, "Content-Type"));
            const std::string base = type.substr(0, type.find(';'));
            if (!type.empty() && base.find("application/json") == std::string::npos)
                return fail_with(415,
                                 "Unsupported Content-Type '" + header(c, "Content-Type") +
                                     "': send the body as JSON, with 'Content-Type: application/json'.",
                                 "invalid_request_error", "unsupported_media_type");
            const std::string length = header(c, "Content-Length");
            if (!length.empty()) {
                char *end = nullptr;
                errno = 0;
                const unsigned long long n = std::strtoull(length.c_str(), &end, 10);
                // Far too large: answered now (the client may not even be sending it). Somewhat too large: read and
                // dropped first, so the client, still sending, reads the answer instead of a reset connection.
                if (errno == 0 && *end == '\0' && n > cfg.max_body) {
                    if (n / 16 > cfg.max_body) return too_large(ex.family);
                    ex.oversize = true;
                }
            }
        }
        return std::nullopt;
    }

    // The request has arrived whole.
    MHD_Result dispatch(Exchange &ex, std::unique_lock<std::mutex> &lock) {
        if (ex.oversize) {
            ex.close_after = true;
            return queue(ex, too_large(ex.family));
        }
        Answer a;
        switch (ex.route->kind) {
            case RouteKind::Health: a = json_answer({{"status", "ok"}}); break;
            case RouteKind::Page:
                a.content_type = "text/html; charset=utf-8";
                a.body = web_page();
                break;
            case RouteKind::Metrics: {
                HttpStats s;
                {
                    std::lock_guard<std::mutex> g(mu);
                    s = stats;
                }
                a = ep.metrics(s);
                break;
            }
            case RouteKind::Models: a = ep.models(); break;
            case RouteKind::Props: a = ep.props(); break;
            case RouteKind::Slots: a = ep.slots(); break;
            default: {
                // Work for a worker; the connection waits suspended.
                ex.state = Exchange::State::Preparing;
                suspend(ex);
                std::shared_ptr<Exchange> self = ex.self.lock();
                {
                    std::lock_guard<std::mutex> g(mu);
                    exchanges.insert(self);
                }
                lock.unlock();
                workers->post([this, self] { prepare(self); });
                return MHD_YES;
            }
        }
        return queue(ex, a);
    }

    // After a resume: the answer, the first event of a job, or back to waiting.
    MHD_Result proceed(Exchange &ex) {
        if (ex.gone) return MHD_NO;  // the client left: the library closes the connection
        if (ex.answer) return queue(ex, *ex.answer);
        if (ex.state != Exchange::State::Waiting) {
            suspend(ex);
            return MHD_YES;
        }
        for (Event e; ex.job->out.pop(e, std::chrono::milliseconds(0));) {
            if (e.kind == Event::Kind::Error) return queue(ex, error_answer(ex.family, job_error(e)));
            if (!ex.stream) {
                ex.reply->add(e);
                if (e.kind == Event::Kind::Done) {
                    Answer a;
                    a.body = ex.reply->body();
                    return queue(ex, a);
                }
                continue;
            }
            // The first event of a stream: its status is known now.
            ex.out = ex.reply->stream(e);
            ex.stream_ended = e.kind == Event::Kind::Done;
            return start_stream(ex);
        }
        suspend(ex);
        return MHD_YES;
    }

    struct StreamCtx {
        Impl *impl;
        std::shared_ptr<Exchange> ex;
    };

    MHD_Result start_stream(Exchange &ex) {
        auto *holder = new StreamCtx{this, ex.self.lock()};
        MHD_Response *r = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16 * 1024,
            [](void *cls, uint64_t, char *buf, size_t max) -> ssize_t {
                auto *sc = static_cast<StreamCtx *>(cls);
                return sc->impl->read_stream(*sc->ex, buf, max);
            },
            holder, [](void *cls) { delete static_cast<StreamCtx *>(cls); });
        if (!r) {
            delete holder;
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        if (ex.close_after) MHD_add_response_header(r, "Connection", "close");
        ex.state = Exchange::State::Streaming;
        ex.status = 200;
        ex.last_write = Clock::now();
        const MHD_Result ok = MHD_queue_response(ex.mhd, 200, r);
        MHD_destroy_response(r);
        return ok;
    }

    MHD_Result queue(Exchange &ex, const Answer &a) {
        MHD_Response *r = MHD_create_response_from_buffer(a.body.size(), const_cast<char *>(a.body.data()),
                                                          MHD_RESPMEM_MUST_COPY);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", a.content_type.c_str());
        for (const auto &[k, v] : a.headers) MHD_add_response_header(r, k.c_str(), v.c_str());
        if (ex.close_after) MHD_add_response_header(r, "Connection", "close");
        ex.state = Exchange::State::Answered;
        ex.status = a.status;
        ex.answer.reset();
        const MHD_Result ok = MHD_queue_response(ex.mhd, unsigned(a.status), r);
        MHD_destroy_response(r);
        return ok;
    }

    // ---- workers -------------------------------------------------------------------------------------------------

    void prepare(const std::shared_ptr<Exchange> &ex) {
        Outcome o;
        {
            std::lock_guard<std::mutex> lock(ex->mu);
            if (ex->gone || ex->finished) return;
        }
        const size_t body_bytes = ex->body.size();
        try {
            const ojson body = parse_body(ex->body);
            std::string().swap(ex->body);  // a big prompt's bytes are not kept while it is answered
            switch (ex->route->kind) {
                case RouteKind::Chat: o = ep.chat(body); break;
                case RouteKind::Completion: o = ep.completion(body); break;
                case RouteKind::Responses: o = ep.responses(body); break;
                case RouteKind::Messages: o = ep.messages(body); break;
                case RouteKind::CountTokens: o.answer = ep.count_tokens(body); break;
                case RouteKind::Infill: o = ep.infill(body); break;
                case RouteKind::Tokenize: o.answer = ep.tokenize(body); break;
                case RouteKind::Detokenize: o.answer = ep.detokenize(body); break;
                case RouteKind::ApplyTemplate: o.answer = ep.apply_template(body); break;
                default: STRATA_ASSERT(false);
            }
        } catch (const ApiError &e) {
            o = Outcome{};
            o.answer = error_answer(ex->family, e);
        } catch (const std::exception &e) {
            o = Outcome{};
            o.answer = error_answer(ex->family, ApiError(500, std::string("Internal server error: ") + e.what(),
                                                         "server_error"));
        }
        std::string().swap(ex->body);
#if defined(__GLIBC__)
        // A big request's transient buffers (body, JSON, prompt text, tokens) go back to the system, not to this
        // thread's malloc arena.
        if (body_bytes > (size_t(1) << 20)) malloc_trim(0);
#endif
        if (!o.job) {
            std::lock_guard<std::mutex> lock(ex->mu);
            ex->answer = std::move(o.answer);
            wake(*ex);
            return;
        }
        std::weak_ptr<Exchange> weak = ex;
        o.job->out.set_listener([weak] {
            if (auto x = weak.lock()) {
                std::lock_guard<std::mutex> lock(x->mu);
                wake(*x);
            }
        });
        {
            std::lock_guard<std::mutex> lock(ex->mu);
            if (ex->gone || ex->finished) return;
            ex->job = o.job;
            ex->reply = std::move(o.reply);
            ex->stream = o.stream;
            ex->state = Exchange::State::Waiting;
        }
        if (!sched.submit(o.job)) {
            std::lock_guard<std::mutex> lock(ex->mu);
            ex->job.reset();
            ex->state = Exchange::State::Preparing;
            ex->answer = sched.draining()
                             ? error_answer(ex->family, ApiError(503, "The server is shutting down. Retry later.",
                                                                 "server_error", {}, "shutting_down"))
                             : error_answer(ex->family,
                                            ApiError(503,
                                                     "The server is overloaded: too many requests are waiting. "
                                                     "Retry later.",
                                                     "server_error", {}, "overloaded"));
            wake(*ex);
        }
    }

    // ---- supervisor ----------------------------------------------------------------------------------------------

    void supervise() {
        std::unique_lock<std::mutex> sl(sup_mu);
        while (!sup_cv.wait_for(sl, kSupervisorPeriod, [&] { return sup_stop; })) {
            const auto now = Clock::now();
            const auto limit = std::chrono::duration_cast<Clock::duration>(
                std::chrono::duration<double>(cfg.read_timeout_s));
            std::vector<std::shared_ptr<Exchange>> waiting;
            {
                std::lock_guard<std::mutex> lock(mu);
                for (Conn *c : conns)
                    if (c->reading && !c->timed_out && now - c->read_since > limit) {
                        // Too slow to send a request, or idle too long between requests: the library sees the
                        // connection end and closes it.
                        shutdown(c->fd, SHUT_RDWR);
                        c->timed_out = true;
                        stats.connections_timed_out++;
                    }
                waiting.assign(exchanges.begin(), exchanges.end());
            }
            for (const auto &ex : waiting) {
                std::lock_guard<std::mutex> lock(ex->mu);
                if (ex->finished || ex->gone || !ex->conn) continue;
                if (!peer_alive(ex->conn->fd)) {
                    ex->gone = true;
                    if (ex->job) {
                        ex->job->cancelled = true;
                        sched.notify();
                    }
                    wake(*ex);
                } else if (ex->state == Exchange::State::Streaming && now - ex->last_write >= kStreamKeepAlive) {
                    ex->keepalive_due = true;
                    wake(*ex);
                }
            }
        }
    }
};

// ---- the library's entry points -------------------------------------------------------------------------------

namespace {

MHD_Result c_request(void *cls, MHD_Connection *c, const char *url, const char *method, const char *,
                     const char *upload, size_t *upload_size, void **con_cls) {
    try {
        return static_cast<HttpServer::Impl *>(cls)->on_request(c, url, method, upload, upload_size, con_cls);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "strata: http: %s\n", e.what());
        return MHD_NO;
    }
}

void c_completed(void *cls, MHD_Connection *, void **con_cls, MHD_RequestTerminationCode toe) {
    static_cast<HttpServer::Impl *>(cls)->on_completed(con_cls, toe);
}

void c_connection(void *cls, MHD_Connection *c, void **socket_context, MHD_ConnectionNotificationCode code) {
    static_cast<HttpServer::Impl *>(cls)->on_connection(c, socket_context, code);
}

// Enough descriptors for every connection the server may hold, and the model files and the rest.
void raise_fd_limit(int need) {
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    const rlim_t want = rlim_t(need);
    if (rl.rlim_cur >= want) return;
    rl.rlim_cur = std::min(want, rl.rlim_max);
    setrlimit(RLIMIT_NOFILE, &rl);
}

sigset_t stop_signals() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    return s;
}

}  // namespace

void block_stop_signals() {
    std::signal(SIGPIPE, SIG_IGN);
    const sigset_t s = stop_signals();
    pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

HttpServer::HttpServer(HttpConfig cfg, Endpoints &endpoints, Scheduler &sched)
    : impl_(std::make_unique<Impl>(std::move(cfg), endpoints, sched)) {
    Impl &m = *impl_;
    if (m.cfg.max_connections < 1) fail("--max-connections must be at least 1 (got %d)", m.cfg.max_connections);
    // Connections past the cap are still read, to be answered 503; past this many more they are closed unread.
    const int hard_limit = m.cfg.max_connections + std::max(64, m.cfg.max_connections / 8);
    raise_fd_limit(hard_limit + 256);
    m.listen_fd = listen_on(m.cfg.host, m.cfg.port, m.port);
    m.workers = std::make_unique<Workers>(m.cfg.workers);
    const unsigned timeout_s = unsigned(std::max(1.0, std::ceil(m.cfg.read_timeout_s)));
    m.daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, nullptr,
        nullptr, &c_request, &m, MHD_OPTION_LISTEN_SOCKET, m.listen_fd, MHD_OPTION_CONNECTION_LIMIT,
        unsigned(hard_limit), MHD_OPTION_CONNECTION_TIMEOUT, timeout_s, MHD_OPTION_NOTIFY_COMPLETED, &c_completed,
        &m, MHD_OPTION_NOTIFY_CONNECTION, &c_connection, &m, MHD_OPTION_EXTERNAL_LOGGER, &mhd_log, nullptr,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, size_t(64 * 1024), MHD_OPTION_END);
    if (!m.daemon) {
        close(m.listen_fd);
        fail("cannot start the HTTP server on %s:%d", m.cfg.host.c_str(), m.port);
    }
    m.supervisor = std::thread([&m] { m.supervise(); });
}

HttpServer::~HttpServer() {
    Impl &m = *impl_;
    {
        std::lock_guard<std::mutex> lock(m.sup_mu);
        m.sup_stop = true;
    }
    m.sup_cv.notify_all();
    if (m.supervisor.joinable()) m.supervisor.join();
    if (m.daemon) MHD_stop_daemon(m.daemon);
    m.workers.reset();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::run() {
    Impl &m = *impl_;
    const sigset_t signals = stop_signals();
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "strata: stopping (signal %d): no new connections; waiting requests get 503; running ones "
                 "have %.0f s to finish (a second signal ends them now)\n", sig, m.cfg.shutdown_grace_s);
    std::fflush(stderr);
    {
        std::lock_guard<std::mutex> lock(m.mu);
        m.shutting_down = true;
    }
    const int lfd = MHD_quiesce_daemon(m.daemon);
    if (lfd >= 0) close(lfd);
    m.sched.drain();

    auto unfinished = [&] {
        std::lock_guard<std::mutex> lock(m.mu);
        return m.n_unfinished;
    };
    const auto grace_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(m.cfg.shutdown_grace_s));
    const timespec tick{0, 100 * 1000 * 1000};
    while (unfinished() > 0 && Clock::now() < grace_end)
        if (sigtimedwait(&signals, nullptr, &tick) > 0) break;  // asked again: no more grace
    m.sched.stop();  // running jobs end with a shutting_down error: 503, or an error event and [DONE]
    const auto flush_end = Clock::now() + kFlushAtShutdown;
    while (unfinished() > 0 && Clock::now() < flush_end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::fprintf(stderr, "strata: stopped\n");
}

}  // namespace strata::server

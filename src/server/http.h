// The HTTP layer of `strata serve`: listening, connections, routes, authorization, request bodies and the answers
// of jobs (whole bodies and server-sent event streams), on libmicrohttpd's event loop. What each route does with a
// request body lives in endpoints.h; this layer knows nothing of models.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata::server {

class Endpoints;
class Scheduler;

struct HttpConfig {
    std::string host = "127.0.0.1";
    int port = 8080;  // 0: any free port
    std::string api_key;
    size_t max_body = size_t(8) << 20;  // bytes
    // Open connections served at once; the next ones get 503 (too_many_connections) and are closed.
    int max_connections = 1024;
    // A request (headers and body) must arrive whole within this many seconds of its connection opening or of the
    // previous answer on it; the connection is closed otherwise. Kept-alive connections idle as long at most.
    double read_timeout_s = 30;
    int keep_alive_requests = 1000;  // answers on one connection before it is closed
    int workers = 4;                 // threads that check request bodies and tokenize prompts
    double shutdown_grace_s = 10;    // how long running requests may go on after SIGTERM/SIGINT
};

// A server bound to its port: construction fails (strata::Error naming the address) when the address is in use or
// not this machine's. run() serves until SIGTERM or SIGINT, then shuts down gracefully: it stops accepting, answers
// waiting requests 503 (shutting_down), lets running ones finish within shutdown_grace_s, ends the rest (streams with
// an error event and [DONE]), and returns. The caller must have blocked SIGTERM and SIGINT in every thread
// (block_stop_signals) before starting any.
class HttpServer {
public:
    HttpServer(HttpConfig cfg, Endpoints &endpoints, Scheduler &sched);
    ~HttpServer();
    HttpServer(const HttpServer &) = delete;
    HttpServer &operator=(const HttpServer &) = delete;

    int port() const;
    void run();

    struct Impl;  // public only for the library's C callbacks

private:
    std::unique_ptr<Impl> impl_;
};

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts from then on (so they wait for
// HttpServer::run's sigwait), and ignores SIGPIPE. Call it first, before the engine starts its threads.
void block_stop_signals();

}  // namespace strata::server

// The TCP connection an HTTP request arrived on, found by its address pair, so that a handler waiting for the engine
// can notice a client that has gone away without writing anything to it (the HTTP library hands handlers no socket,
// and any byte written would fix the response's status). Linux only (it looks through /proc/self/fd); where the
// socket cannot be found the client is taken to be there.
#pragma once

#include <string>

namespace strata::server {

class ClientConnection {
public:
    ClientConnection() = default;
    // The socket whose local end is local_addr:local_port and whose peer is remote_addr:remote_port (numeric
    // addresses, as getnameinfo writes them). The socket belongs to the HTTP library: it stays valid while the
    // request is being handled, and this object must not be used after that.
    ClientConnection(const std::string &local_addr, int local_port, const std::string &remote_addr, int remote_port);

    bool found() const { return fd_ >= 0; }
    // False once the client has closed the connection or it broke. Never blocks and consumes nothing: bytes the
    // client has sent (a pipelined request) stay for the HTTP library to read.
    bool alive() const;

private:
    int fd_ = -1;
};

}  // namespace strata::server

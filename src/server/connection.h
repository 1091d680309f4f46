// Whether the client of a TCP connection is still there, asked without writing to it (any byte written would fix the
// response's status) and without consuming what it sent: how the HTTP layer notices a client that left while its
// answer waits in a suspended connection, which the HTTP library does not watch.
#pragma once

namespace strata::server {

// False once the peer has closed the connection or it broke. Never blocks; bytes the client has sent (a pipelined
// request) stay for the HTTP library to read. A negative fd counts as alive.
bool peer_alive(int fd);

}  // namespace strata::server

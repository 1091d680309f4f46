// Asking a socket whether its peer is still there.
#include "server/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <cerrno>

namespace strata::server {

bool peer_alive(int fd) {
    if (fd < 0) return true;
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return true;  // nothing to report (or interrupted: ask again next time)
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return false;
    if (p.revents & POLLIN) {
        // Readable: either bytes of a next request, or the end of the stream (the client closed).
        char c;
        const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
    }
    return !(p.revents & POLLRDHUP);
}

}  // namespace strata::server

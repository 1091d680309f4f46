// Finding a request's socket by its addresses, and asking it whether the peer is still there.
#include "server/connection.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>

namespace strata::server {

namespace {

// A socket address as numeric host and port, written as the HTTP library writes the request's addresses.
bool address_of(const sockaddr_storage &a, socklen_t len, std::string &host, int &port) {
    if (a.ss_family == AF_INET)
        port = ntohs(reinterpret_cast<const sockaddr_in &>(a).sin_port);
    else if (a.ss_family == AF_INET6)
        port = ntohs(reinterpret_cast<const sockaddr_in6 &>(a).sin6_port);
    else
        return false;
    char buf[NI_MAXHOST];
    if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0)
        return false;
    host = buf;
    return true;
}

bool ends_are(int fd, const std::string &local_addr, int local_port, const std::string &remote_addr, int remote_port) {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    std::string host;
    int port = -1;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) return false;  // not a connected socket
    if (!address_of(a, len, host, port) || port != remote_port || host != remote_addr) return false;
    len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) return false;
    return address_of(a, len, host, port) && port == local_port && host == local_addr;
}

}  // namespace

ClientConnection::ClientConnection(const std::string &local_addr, int local_port, const std::string &remote_addr,
                                   int remote_port) {
    // A TCP connection is the only socket with its pair of ends, so the match is exact; the fds of other
    // connections that open and close meanwhile cannot be mistaken for it.
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return;
    while (const dirent *ent = readdir(dir)) {
        char *end = nullptr;
        const long fd = std::strtol(ent->d_name, &end, 10);
        if (end == ent->d_name || *end || fd == dirfd(dir)) continue;
        if (ends_are(int(fd), local_addr, local_port, remote_addr, remote_port)) {
            fd_ = int(fd);
            break;
        }
    }
    closedir(dir);
}

bool ClientConnection::alive() const {
    if (fd_ < 0) return true;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return true;  // nothing to report (or interrupted: ask again next time)
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return false;
    if (p.revents & POLLIN) {
        // Readable: either bytes of a next request, or the end of the stream (the client closed).
        char c;
        const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
    }
    return !(p.revents & POLLRDHUP);
}

}  // namespace strata::server

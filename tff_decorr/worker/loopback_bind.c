// Preloaded (LD_PRELOAD) into TFF's worker_binary by tff_decorr/worker/loopback.py.
//
// Why: TFF 0.87's worker_binary hard-codes its gRPC listening address as "[::]:<port>" and has no
// flag for it, so the insecure, unauthenticated executor service (which runs any TensorFlow graph
// it is sent, file reads and writes included) would be reachable from every network the machine
// is on. This library wraps bind(2): a bind to the IPv4 wildcard becomes a bind to 127.0.0.1, and
// a bind to the IPv6 wildcard becomes a bind to ::ffff:127.0.0.1 (the IPv4-mapped loopback; gRPC's
// "[::]" socket is dual-stack, so it then accepts exactly IPv4 connections to 127.0.0.1). Every
// other bind is passed through unchanged. Clients connect to 127.0.0.1:<port>.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real_bind = 0;
  if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  if (!real_bind) {
    errno = ENOSYS;
    return -1;
  }
  if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  } else if (addr && addr->sa_family == AF_INET6 &&
             len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      static const unsigned char mapped_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                        0, 0, 0xff, 0xff, 127, 0, 0, 1};
      memcpy(&a.sin6_addr, mapped_loopback, sizeof mapped_loopback);
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  }
  return real_bind(fd, addr, len);
}

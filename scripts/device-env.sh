# Sourced on the GPU machine after `source .peer/device.sh env`: what Strata's build needs there beyond the unpacked
# .debs. libmicrohttpd.pc names gnutls as a private requirement (static links only), and the machine has the
# library but no gnutls.pc: a minimal one lets pkg-config resolve libmicrohttpd for the shared link.
pc=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
if [ -d "$pc" ] && [ ! -e "$pc/gnutls.pc" ]; then
  printf 'Name: gnutls\nDescription: shim for the shared link of libmicrohttpd\nVersion: 3.7\nLibs: -lgnutls\nCflags:\n' > "$pc/gnutls.pc"
fi

//! Ethernet/IPv4 frames as the router sees them: what to read, what to rewrite.
//!
//! The emulator routes on the IPv4 destination only. Forwarding a frame
//! means what a router does to it: new source and destination MAC addresses
//! (the egress interface's and the next host's), TTL minus one and the
//! header checksum recomputed. Payload checksums are left alone, which is why
//! the hosts' veth ends must not offload them (the lab turns that off).

pub const ETH_HLEN: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;

/// What the router needs from a frame, if it is an IPv4 packet it can route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4 {
    pub src: u32,
    pub dst: u32,
    pub ttl: u8,
    pub ihl: usize,
}

pub fn ethertype(f: &[u8]) -> Option<u16> {
    (f.len() >= ETH_HLEN).then(|| u16::from_be_bytes([f[12], f[13]]))
}

pub fn ipv4(f: &[u8]) -> Option<Ipv4> {
    if ethertype(f)? != ETHERTYPE_IPV4 || f.len() < ETH_HLEN + 20 {
        return None;
    }
    let ip = &f[ETH_HLEN..];
    if ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    if ihl < 20 || ip.len() < ihl {
        return None;
    }
    Some(Ipv4 { src: u32::from_be_bytes([ip[12], ip[13], ip[14], ip[15]]), dst: u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]), ttl: ip[8], ihl })
}

/// The Internet checksum of an IPv4 header whose checksum field is zero.
pub fn header_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for w in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Rewrite a routable frame for its next hop. False when its TTL ran out
/// (a router drops it).
pub fn forward(f: &mut [u8], ip: &Ipv4, src_mac: &[u8; 6], dst_mac: &[u8; 6]) -> bool {
    if ip.ttl <= 1 {
        return false;
    }
    f[0..6].copy_from_slice(dst_mac);
    f[6..12].copy_from_slice(src_mac);
    let h = &mut f[ETH_HLEN..ETH_HLEN + ip.ihl];
    h[8] = ip.ttl - 1;
    h[10] = 0;
    h[11] = 0;
    let c = header_checksum(h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ttl: u8) -> Vec<u8> {
        let mut f = vec![0u8; ETH_HLEN + 28];
        f[12] = 0x08;
        let ip = &mut f[ETH_HLEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&28u16.to_be_bytes());
        ip[8] = ttl;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[10, 77, 1, 2]);
        ip[16..20].copy_from_slice(&[10, 77, 2, 2]);
        let c = header_checksum(&ip[..20]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f
    }

    #[test]
    fn an_ipv4_frame_is_parsed_with_its_addresses() {
        let ip = ipv4(&frame(64)).unwrap();
        assert_eq!((ip.src, ip.dst, ip.ttl, ip.ihl), (0x0a4d0102, 0x0a4d0202, 64, 20));
    }

    #[test]
    fn forwarding_decrements_ttl_and_keeps_the_checksum_valid() {
        let mut f = frame(64);
        let ip = ipv4(&f).unwrap();
        assert!(forward(&mut f, &ip, &[2; 6], &[3; 6]));
        assert_eq!(f[ETH_HLEN + 8], 63);
        assert_eq!(&f[0..6], &[3; 6]);
        assert_eq!(&f[6..12], &[2; 6]);
        // A valid header sums to zero, checksum included.
        let mut sum = 0u32;
        for w in f[ETH_HLEN..ETH_HLEN + 20].chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
    }

    #[test]
    fn a_frame_whose_ttl_runs_out_is_not_forwarded() {
        let mut f = frame(1);
        let ip = ipv4(&f).unwrap();
        assert!(!forward(&mut f, &ip, &[2; 6], &[3; 6]));
    }

    #[test]
    fn non_ipv4_frames_are_not_routed() {
        let mut f = frame(64);
        f[12] = 0x08;
        f[13] = 0x06; // ARP
        assert!(ipv4(&f).is_none());
        assert!(ipv4(&f[..10]).is_none());
    }
}

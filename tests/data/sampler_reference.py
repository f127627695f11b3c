#!/usr/bin/env python3
"""An independent implementation of the permutation documented in docs/data.md and
include/regroup/data.h; prints the known-answer vectors checked by test_data_sampler.c."""
M=(1<<64)-1
def mix(z):
    z=((z^(z>>30))*0xBF58476D1CE4E5B9)&M
    z=((z^(z>>27))*0x94D049BB133111EB)&M
    return z^(z>>31)
def perm(seed,epoch,n):
    st=[mix(seed)^mix(epoch^0xD1B54A32D192ED03)]
    def nxt():
        st[0]=(st[0]+0x9E3779B97F4A7C15)&M
        return mix(st[0])
    def below(r):
        m=(nxt()>>32)*r; low=m&0xffffffff
        if low<r:
            t=((1<<32)-r)%r
            while low<t:
                m=(nxt()>>32)*r; low=m&0xffffffff
        return m>>32
    p=list(range(n))
    for i in range(n-1,0,-1):
        j=below(i+1); p[i],p[j]=p[j],p[i]
    return p
for args in [(42, 0, 10), (42, 1, 10), (7, 3, 20)]:
    print(args, perm(*args))
print((2026, 5, 60000), perm(2026, 5, 60000)[:8])

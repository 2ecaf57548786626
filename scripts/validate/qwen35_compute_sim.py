#!/usr/bin/env python3
"""Step-by-step re-implementation of what llama.cpp (vendored in llama-cpp-python 0.3.36) does
when it reserves the CUDA compute buffer for the `qwen35` graph (sched_reserve):

  1. build the graph exactly as src/models/qwen35.cpp + src/models/delta-net-base.cpp +
     src/llama-graph.cpp do (same ops, same src order, same ggml_build_forward_expand calls,
     so the same node order as ggml_visit_parents_graph, ggml/src/ggml.c:7245);
  2. assign backends / split as ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp:1066):
     graph inputs -> CPU, get_rows on the host token_embd -> CPU, everything else CUDA; the CUDA
     split's inputs are copied in (one copy per tensor, at the split start, ggml-backend.cpp:1510-1531);
  3. run ggml-alloc's graph allocator (ggml/src/ggml-alloc.c:718-830, dyn_tallocr :202-376)
     on the CUDA buffer (alignment 128, ggml-cuda.cu:897; alloc size ggml-cuda.cu:903 incl. the
     FLASH_ATTN_EXT f16 K/V extra, fattn.cu:722 + fattn-common.cuh:53).
The buffer size is max over the reserved graphs (pp, tg, pp again; llama-context.cpp:672-730,
the buffer only grows: ggml-alloc.c:915-921) of the chunk's max_size.
"""
import sys, threading

ALIGN = 128
# ggml types: (name, block size, type size)
TYPES = {'f32': (1, 4), 'f16': (1, 2), 'i32': (1, 4), 'i64': (1, 8), 'q8_0': (32, 34), 'q4_0': (32, 18)}

def pad(x, a=ALIGN):
    return (x + a - 1) // a * a

def row_size(t, n):
    b, s = TYPES[t]
    assert n % b == 0
    return n // b * s

FLAG_INPUT, FLAG_OUTPUT = 1, 2
INPLACE_OPS = {'FILL', 'SCALE', 'DIAG_MASK_ZERO', 'DIAG_MASK_INF', 'ADD', 'ADD_ID', 'ADD1', 'SUB', 'MUL', 'DIV',
               'SQR', 'SQRT', 'LOG', 'UNARY', 'ROPE', 'ROPE_BACK', 'SILU_BACK', 'RMS_NORM', 'RMS_NORM_BACK',
               'CLAMP', 'SOFT_MAX', 'SOFT_MAX_BACK'}  # ggml-alloc.c:22-49
VIEW_OPS = {'VIEW', 'RESHAPE', 'PERMUTE', 'TRANSPOSE'}  # ggml_is_view_op

_ids = [0]

class T:
    def __init__(self, typ, ne, op='NONE', src=(), view_src=None, view_offs=0, nb=None, name='', ext=False):
        ne = list(ne) + [1] * (4 - len(ne))
        self.type, self.ne, self.op = typ, ne, op
        self.src = list(src)
        if view_src is not None and view_src.view_src is not None:  # ggml.c:1778
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        self.view_src, self.view_offs = view_src, view_offs
        if nb is None:
            b, s = TYPES[typ]
            nb = [s, row_size(typ, ne[0])]
            nb += [nb[1] * ne[1], nb[1] * ne[1] * ne[2]]
        self.nb = list(nb)
        self.flags = 0
        self.name = name
        # "data != NULL": external (weights, KV cache, recurrent state) and views of them
        self.ext = ext or (view_src is not None and view_src.ext)
        self.backend = None
        _ids[0] += 1
        self.id = _ids[0]

    def nbytes(self):
        if any(n <= 0 for n in self.ne):
            return 0
        b, s = TYPES[self.type]
        if b == 1:
            n = s + sum((self.ne[i] - 1) * self.nb[i] for i in range(4))
        else:
            n = self.ne[0] * self.nb[0] // b + sum((self.ne[i] - 1) * self.nb[i] for i in range(1, 4))
        return n

    def nelements(self):
        r = 1
        for n in self.ne:
            r *= n
        return r

    def is_contiguous(self):
        return self.nb == T(self.type, self.ne).nb

    def __repr__(self):
        return f'{self.name or self.op}{self.ne[:4]}'

# ---------------------------------------------------------------- ggml ops (ggml.c)
def dup(a, op, src, name=''):
    return T(a.type, a.ne, op, src, name=name)

def new(typ, ne, op, src, name=''):
    return T(typ, ne, op, src, name=name)

def view(a, ne, nb, offs, op='VIEW', name=''):
    nb = list(nb) + [0] * (4 - len(nb))
    ne = list(ne) + [1] * (4 - len(ne))
    # fill strides of the trailing dims as ggml_view_impl does (nb[i] = nb[i-1]*ne[i-1])
    for i in range(len(nb)):
        if nb[i] == 0:
            nb[i] = nb[i - 1] * ne[i - 1] if i else TYPES[a.type][1]
    return T(a.type, ne, op, [a], view_src=a, view_offs=offs, nb=nb, name=name)

def view_1d(a, n0, offs):
    return view(a, [n0], [TYPES[a.type][1], 0, 0, 0], offs)

def view_2d(a, n0, n1, nb1, offs):
    return view(a, [n0, n1], [TYPES[a.type][1], nb1, 0, 0], offs)

def view_3d(a, n0, n1, n2, nb1, nb2, offs):
    return view(a, [n0, n1, n2], [TYPES[a.type][1], nb1, nb2, 0], offs)

def view_4d(a, n0, n1, n2, n3, nb1, nb2, nb3, offs):
    return view(a, [n0, n1, n2, n3], [TYPES[a.type][1], nb1, nb2, nb3], offs)

def reshape(a, *ne):
    assert a.is_contiguous()
    t = T(a.type, ne, 'RESHAPE', [a], view_src=a, view_offs=0)
    assert t.nelements() == a.nelements()
    return t

def permute(a, ax0, ax1, ax2, ax3):
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate((ax0, ax1, ax2, ax3)):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    return T(a.type, ne, 'PERMUTE', [a], view_src=a, view_offs=0, nb=nb)

def transpose(a):
    ne = [a.ne[1], a.ne[0], a.ne[2], a.ne[3]]
    nb = [a.nb[1], a.nb[0], a.nb[2], a.nb[3]]
    return T(a.type, ne, 'TRANSPOSE', [a], view_src=a, view_offs=0, nb=nb)

def view_tensor(a, op, src):  # ggml_view_tensor: a view of the whole of a
    return T(a.type, a.ne, op, src, view_src=a, view_offs=0, nb=a.nb)

def mul_mat(a, b, name=''):
    return new('f32', [a.ne[1], b.ne[1], b.ne[2], b.ne[3]], 'MUL_MAT', [a, b], name)

def get_rows(a, b, name=''):
    return new('i32' if a.type == 'i32' else 'f32', [a.ne[0], b.ne[0], b.ne[1], b.ne[2]], 'GET_ROWS', [a, b], name)

def rms_norm(a):   return dup(a, 'RMS_NORM', [a])
def mul(a, b):     return dup(a, 'MUL', [a, b])
def add(a, b):     return dup(a, 'ADD', [a, b])
def scale(a):      return dup(a, 'SCALE', [a])
def unary(a):      return dup(a, 'UNARY', [a])
def scale_inplace(a): return view_tensor(a, 'SCALE', [a])
def cont(a, *ne):  return new(a.type, ne if ne else a.ne, 'CONT', [a])
def concat(a, b, dim):
    ne = list(a.ne); ne[dim] += b.ne[dim]
    return new(a.type, ne, 'CONCAT', [a, b])
def ssm_conv(sx, c):
    return new('f32', [c.ne[1], sx.ne[0] - c.ne[0] + 1, sx.ne[2]], 'SSM_CONV', [sx, c])
def gated_delta_net(q, k, v, g, b, s, K=1):  # ggml.c:6375
    S, H, nt, ns = v.ne
    return new('f32', [S * H, nt * ns + K * S * ns, 1, 1], 'GATED_DELTA_NET', [q, k, v, g, b, s])
def rope(a, pos):  return dup(a, 'ROPE', [a, pos])
def set_rows(a, b, c): return view_tensor(a, 'SET_ROWS', [b, c, a])
def cpy(a, b):     return view_tensor(b, 'CPY', [a, b])
def glu(a, b):     return new(a.type, a.ne, 'GLU', [a, b])
def soft_max_ext(a, mask): return dup(a, 'SOFT_MAX', [a, mask])
def flash_attn_ext(q, k, v, mask):
    return new('f32', [v.ne[0], q.ne[2], q.ne[1], q.ne[3]], 'FLASH_ATTN_EXT', [q, k, v, mask])

def weight(*ne, name='w'):
    return T('f16', ne, name=name, ext=True)

def inp(typ, ne, name):
    t = T(typ, ne, name=name)
    t.flags |= FLAG_INPUT
    return t

# ---------------------------------------------------------------- graph (ggml.c:7245)
class Graph:
    def __init__(self):
        self.nodes, self.leafs, self.visited = [], [], set()

    def expand(self, t):
        self._visit(t)

    def _visit(self, t):
        if t.id in self.visited:
            return
        self.visited.add(t.id)
        for s in t.src:
            if s is not None:
                self._visit(s)
        if t.op == 'NONE':
            self.leafs.append(t)
        else:
            self.nodes.append(t)

# ---------------------------------------------------------------- qwen35 graph
def build_qwen35(hp, T_, n_outputs, n_kv, fa, type_k, type_v, fused_gdn=True):
    e, f, H, Hkv, d, V = hp['e'], hp['f'], hp['H'], hp['Hkv'], hp['d'], hp['V']
    S, Hk, Hv, Kc, L, interval = hp['S'], hp['Hk'], hp['Hv'], hp['conv'], hp['L'], hp['interval']
    d_inner = S * Hv
    conv_ch = d_inner + 2 * Hk * S
    n_embd_r = (Kc - 1) * conv_ch
    n_embd_s = S * d_inner
    quant = lambda t: t in ('q8_0', 'q4_0')
    gf = Graph()
    n_seqs = 1
    # -- build_inp_embd (llama-graph.cpp:2376)
    tok_embd = weight(e, V, name='token_embd')
    tok_embd.host = True
    tokens = inp('i32', [T_], 'inp_tokens')
    embd = inp('f32', [e, T_], 'inp_embd')
    cur0 = get_rows(tok_embd, tokens, 'get_rows_embd')
    cur0.cpu = True
    gf.expand(cur0)              # ggml_build_forward_select: inps[0] (compute)
    gf.expand(embd)              # inps[1] (leaf)
    gf.expand(cur0)
    inpL = cur0
    # -- build_inp_mem_hybrid (llama-graph.cpp:3633)
    n_rs = 1
    s_copy = inp('i32', [n_rs], 'rs_s_copy')
    s_copy_main = view_1d(s_copy, n_seqs, 0); s_copy_main.name = 's_copy_main'
    s_copy_extra = view_1d(s_copy, n_rs - n_seqs, n_seqs * 4); s_copy_extra.name = 's_copy_extra'
    v_trans = not fa
    k_idxs = inp('i64', [T_], 'k_idxs')
    v_idxs = inp('i64', [T_ * Hkv * d] if v_trans else [T_], 'v_idxs')
    kq_mask = inp('f16' if fa else 'f32', [n_kv, T_, 1, 1], 'kq_mask')
    k_rot = v_rot = None
    if quant(type_k) and d % 64 == 0:
        nrot = 64
        while True:
            nrot *= 2
            if d % nrot != 0:
                break
        nrot //= 2
        k_rot = inp('f32', [nrot, nrot], 'k_rot')
    if quant(type_v) and d % 64 == 0:
        v_rot = inp('f32', [64, 64], 'v_rot')
    inp_pos = inp('i32', [T_ * 4], 'inp_pos')
    out_ids = inp('i32', [n_outputs], 'out_ids')

    def build_norm(x, nm=''):
        r = rms_norm(x); r.name = nm + '_rms'
        m = mul(r, weight(x.ne[0])); m.name = nm
        return m

    def build_rs(s_all, state_size):  # llama-graph.cpp:3512
        states = reshape(s_all, state_size, s_all.ne[1])
        state_zero = view_1d(states, state_size, 0)
        gf.expand(scale_inplace(state_zero))
        out = get_rows(states, s_copy_main, 'rs_get_rows')
        gf.expand(out)
        extra = get_rows(states, s_copy_extra, 'rs_get_rows_extra')
        gf.expand(cpy(extra, view_2d(s_all, state_size, n_rs - n_seqs, s_all.nb[1], n_seqs * s_all.nb[1])))
        return out

    def hadamard(x, rot):  # llama-impl.h:57
        n = rot.ne[0]
        r = reshape(x, n, x.nelements() // n) if x.is_contiguous() else cont(x, n, x.nelements() // n)
        r = mul_mat(rot, r, 'hadamard')
        return reshape(r, *x.ne)

    def layer_linear(x, il):  # qwen35.cpp:335
        qkv_mixed = mul_mat(weight(e, conv_ch), x, f'qkv_mixed-{il}')
        qkv_mixed = reshape(qkv_mixed, conv_ch, T_, n_seqs)
        z = mul_mat(weight(e, d_inner), x, f'z-{il}')
        beta = mul_mat(weight(e, Hv), x, 'beta')
        beta = reshape(beta, 1, Hv, T_, n_seqs)
        beta = unary(beta)
        alpha = mul_mat(weight(e, Hv), x, 'alpha')
        alpha = reshape(alpha, Hv, T_, n_seqs)
        alpha_b = add(alpha, weight(Hv))
        alpha_sp = unary(alpha_b)
        gate = mul(alpha_sp, weight(Hv))
        gate = reshape(gate, 1, Hv, T_, n_seqs)
        conv_all = T('f32', [n_embd_r, 1], name='conv_states_all', ext=True)
        ssm_all = T('f32', [n_embd_s, 1], name='ssm_states_all', ext=True)
        # build_conv_state (delta-net-base.cpp:449)
        conv_states = build_rs(conv_all, n_embd_r)
        conv_states = reshape(conv_states, Kc - 1, conv_ch, n_seqs)
        qkv_t = transpose(qkv_mixed)
        conv_input = concat(conv_states, qkv_t, 0); conv_input.name = f'conv_input-{il}'
        last = view_3d(conv_input, Kc - 1, conv_ch, n_seqs, conv_input.nb[1], conv_input.nb[2],
                       (conv_input.ne[0] - conv_states.ne[0]) * 4)
        upd = view_2d(conv_all, n_embd_r, n_seqs, conv_all.nb[1], 0)
        gf.expand(cpy(last, upd))
        state = build_rs(ssm_all, n_embd_s)
        state = reshape(state, S, S, Hv, n_seqs)
        conv_out = ssm_conv(conv_input, weight(Kc, conv_ch)); conv_out.name = f'conv_out-{il}'
        conv_silu = unary(conv_out); conv_silu.name = f'conv_silu-{il}'
        nb1 = 4 * conv_ch
        q_conv = view_4d(conv_silu, S, Hk, T_, n_seqs, 4 * S, nb1, nb1 * T_, 0)
        k_conv = view_4d(conv_silu, S, Hk, T_, n_seqs, 4 * S, nb1, nb1 * T_, S * Hk * 4)
        v_conv = view_4d(conv_silu, S, Hv, T_, n_seqs, 4 * S, nb1, nb1 * T_, 4 * 2 * S * Hk)
        q_conv = scale(rms_norm(q_conv))
        k_conv = scale(rms_norm(k_conv))
        if not fused_gdn and Hk != Hv:
            raise NotImplementedError
        # build_recurrent_attn (delta-net-base.cpp:527) -> build_delta_net_fused (:373)
        res = gated_delta_net(q_conv, k_conv, v_conv, gate, beta, state); res.name = f'gdn-{il}'
        output = view_4d(res, S, Hv, T_, n_seqs, 4 * S, 4 * S * Hv, 4 * S * Hv * T_, 0)
        new_state = view_4d(res, S, S, Hv, n_seqs, 4 * S, 4 * S * S, 4 * S * S * Hv, 4 * S * Hv * T_ * n_seqs)
        gf.expand(cpy(new_state, view_2d(ssm_all, n_embd_s, n_seqs, ssm_all.nb[1], 0)))
        z2 = reshape(z, S, Hv, T_, n_seqs)
        normalized = build_norm(output, f'gdn_norm-{il}')
        gsilu = unary(z2)
        aon = mul(normalized, gsilu)
        fin = reshape(aon, S * Hv, T_, n_seqs)
        o = mul_mat(weight(d_inner, e), fin, f'linear_attn_out-{il}')
        return reshape(o, e, T_ * n_seqs)

    def layer_attn(x, il):  # qwen35.cpp:250
        Qf = mul_mat(weight(e, 2 * d * H), x, f'Qcur_full-{il}')
        K_ = mul_mat(weight(e, d * Hkv), x, f'Kcur-{il}')
        V_ = mul_mat(weight(e, d * Hkv), x, f'Vcur-{il}')
        Q = view_3d(Qf, d, H, T_, 4 * 2 * d, 4 * 2 * d * H, 0)
        Q = build_norm(Q, f'Qnorm-{il}')
        K_ = reshape(K_, d, Hkv, T_)
        K_ = build_norm(K_, f'Knorm-{il}')
        g = view_3d(Qf, d, H, T_, 4 * 2 * d, 4 * 2 * d * H, 4 * d)
        g = cont(g, d * H, T_); g.name = f'gate-{il}'
        V_ = reshape(V_, d, Hkv, T_)
        Q = rope(Q, inp_pos); Q.name = f'Qrope-{il}'
        K_ = rope(K_, inp_pos); K_.name = f'Krope-{il}'
        # build_attn (llama-graph.cpp:2868)
        if k_rot is not None:
            Q = hadamard(Q, k_rot)
            K_ = hadamard(K_, k_rot)
        if v_rot is not None:
            V_ = hadamard(V_, v_rot)
        gf.expand(Q); gf.expand(V_); gf.expand(K_)
        kc = T(type_k, [Hkv * d, n_kv, 1], name='k_cache', ext=True)
        vc = T(type_v, [Hkv * d, n_kv, 1], name='v_cache', ext=True)
        kv2 = view_2d(K_, d * Hkv, T_, K_.nb[2], 0)
        gf.expand(set_rows(kc, kv2, k_idxs))
        if not v_trans:
            vv2 = view_2d(V_, d * Hkv, T_, V_.nb[2], 0)
            gf.expand(set_rows(vc, vv2, v_idxs))
        else:
            vv2 = reshape(V_, d * Hkv, T_)
            v_view = reshape(vc, 1, vc.nelements())
            vv2 = reshape(vv2, 1, vv2.nelements())
            gf.expand(set_rows(v_view, vv2, v_idxs))
        rs = row_size
        k = view_4d(kc, d, Hkv, n_kv, 1, rs(type_k, d), rs(type_k, d * Hkv), rs(type_k, d * Hkv * n_kv), 0)
        if not v_trans:
            v = view_4d(vc, d, Hkv, n_kv, 1, rs(type_v, d), rs(type_v, d * Hkv), rs(type_v, d * Hkv * n_kv), 0)
        else:
            v = view_4d(vc, n_kv, Hkv, d, 1, rs(type_v, n_kv * d), rs(type_v, n_kv), rs(type_v, n_kv * d * Hkv), 0)
        # build_attn_mha (llama-graph.cpp:2616)
        q = view_4d(Q, Q.ne[0], Q.ne[1], Q.ne[2], 1, Q.nb[1], Q.nb[2], Q.nb[2] * Q.ne[2], 0)
        q = permute(q, 0, 2, 1, 3)
        k = permute(k, 0, 2, 1, 3)
        v = permute(v, 0, 2, 1, 3)
        if fa:
            if v_trans:
                v = transpose(v)
            c = flash_attn_ext(q, k, v, kq_mask); c.name = f'fattn-{il}'
            c = reshape(c, c.ne[0] * c.ne[1], c.ne[2] * c.ne[3])
        else:
            kq = mul_mat(k, q, f'kq-{il}')
            kq = soft_max_ext(kq, kq_mask); kq.name = f'kq_softmax-{il}'
            kqv = mul_mat(v, kq, f'kqv-{il}')
            c = permute(kqv, 0, 2, 1, 3)
            c = cont(c, c.ne[0] * c.ne[1], c.ne[2] * c.ne[3]); c.name = f'kqv_out-{il}'
        gf.expand(c)
        if v_rot is not None:
            c = hadamard(c, v_rot)
        gs = unary(g); gs.name = f'gate_sigmoid-{il}'
        c = mul(c, gs)
        c = mul_mat(weight(d * H, e), c, f'attn_out-{il}')
        return c

    for il in range(L):
        inpSA = inpL
        cur = build_norm(inpL, f'attn_norm-{il}')
        gf.expand(cur)
        recr = (il + 1) % interval != 0
        cur = layer_linear(cur, il) if recr else layer_attn(cur, il)
        cur = add(cur, inpSA); cur.name = f'attn_residual-{il}'
        ffn_res = cur
        apn = build_norm(cur, f'attn_post_norm-{il}')
        up = mul_mat(weight(e, f), apn, f'ffn_up-{il}')
        gate = mul_mat(weight(e, f), apn, f'ffn_gate-{il}')
        sw = glu(gate, up); sw.name = f'swiglu-{il}'
        down = mul_mat(weight(f, e), sw, f'ffn_down-{il}')
        cur = add(down, ffn_res); cur.name = f'l_out-{il}'
        inpL = cur
    cur = build_norm(inpL, 'h_nextn')
    cur.flags |= FLAG_OUTPUT
    cur = get_rows(cur, out_ids, 'result_norm')
    cur.flags |= FLAG_OUTPUT
    cur = mul_mat(weight(e, V), cur, 'result_output')
    cur.flags |= FLAG_OUTPUT
    gf.expand(cur)
    return gf

# ---------------------------------------------------------------- scheduler (ggml-backend.cpp:1066)
CPU, GPU = 1, 0

def schedule(gf):
    """returns the graph_copy node list with per-node backend, input copies inserted at the CUDA split start"""
    for l in gf.leafs:
        l.backend = CPU if (l.flags & FLAG_INPUT or getattr(l, 'host', False)) else GPU
    for n in gf.nodes:
        if getattr(n, 'cpu', False):
            n.backend = CPU
        elif n.view_src is not None and n.op in VIEW_OPS:
            n.backend = None
        else:
            n.backend = GPU
    for n in gf.nodes:  # pass 4: views follow their source
        if n.backend is None:
            n.backend = n.view_src.backend
    # pass 5: splits by backend over non-view nodes
    splits = []
    cur = None
    for i, n in enumerate(gf.nodes):
        if n.op in VIEW_OPS:
            continue
        if n.backend != cur:
            splits.append([n.backend, i, [], ])
            cur = n.backend
    for k in range(len(splits)):
        splits[k].append(splits[k + 1][1] if k + 1 < len(splits) else len(gf.nodes))
    copies = {}
    for sp in splits:
        be, i0, inputs, i1 = sp
        for n in gf.nodes[i0:i1]:
            if n.op in VIEW_OPS:
                continue
            for j, s in enumerate(n.src):
                if s is None:
                    continue
                if s.backend != be and be == GPU:
                    key = (s.id, be)
                    if key not in copies:
                        c = T(s.type, s.ne, nb=s.nb, name='CUDA0#' + (s.name or s.op) + '#0')
                        c.backend = be
                        copies[key] = c
                        inputs.append(s)
                    n.src[j] = copies[key]
    out = []
    for be, i0, inputs, i1 in splits:
        for s in inputs:
            dep = T(s.type, s.ne, 'NONE', [s], view_src=s, nb=s.nb)  # input_dep (op NONE)
            dep.backend = s.backend
            out.append(dep)
            out.append(copies[(s.id, be)])
        out.extend(gf.nodes[i0:i1])
    # nodes before the first split (views) keep their place
    first = splits[0][1]
    return gf.nodes[:first] + out, gf.leafs

# ---------------------------------------------------------------- ggml-alloc (ggml-alloc.c)
class DynTallocr:
    def __init__(self):
        self.blocks = None  # list of [offset, size]
        self.max_size = 0

    def alloc(self, size):
        size = pad(size)
        if self.blocks is None:   # new chunk, ggml-alloc.c:162 (max_chunk_size = SIZE_MAX/2)
            self.blocks = [[0, 1 << 62]]
        best, best_size = -1, None
        for i in range(len(self.blocks) - 1):
            b = self.blocks[i]
            if b[1] >= size and (best_size is None or b[1] <= best_size):
                best, best_size = i, b[1]
        if best == -1:
            b = self.blocks[-1]
            assert b[1] >= size
            best = len(self.blocks) - 1
        b = self.blocks[best]
        addr = b[0]
        b[0] += size
        b[1] -= size
        if b[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, addr + size)
        return addr

    def free(self, addr, size):
        size = pad(size)
        bl = self.blocks
        for i, b in enumerate(bl):
            if b[0] + b[1] == addr:
                b[1] += size
                if i < len(bl) - 1 and b[0] + b[1] == bl[i + 1][0]:
                    b[1] += bl[i + 1][1]
                    del bl[i + 1]
                return
            if addr + size == b[0]:
                b[0] = addr
                b[1] += size
                if i > 0 and bl[i - 1][0] + bl[i - 1][1] == b[0]:
                    bl[i - 1][1] += b[1]
                    del bl[i]
                return
        pos = 0
        while pos < len(bl) and bl[pos][0] < addr:
            pos += 1
        bl.insert(pos, [addr, size])


def alloc_size(t):  # ggml-cuda.cu:903
    if t.op == 'FLASH_ATTN_EXT':
        q, k, v = t.src[0], t.src[1], t.src[2]
        end = t.nbytes()
        # MMA kernel on Hopper for > 2 columns with a quantized cache (fattn.cu:633-665): f16 K and V
        quant_kv = k.type in ('q8_0', 'q4_0') or v.type in ('q8_0', 'q4_0')
        # MMA (q.ne[1] > 2 on cc >= Ada): always f16 K/V; VEC (tg graph): f16 only without a compiled
        # quantized vec case -- assumed here (upper bound; the tg graph never sets the size, see report)
        need = quant_kv
        if need and k.type != 'f16':
            end = pad(end) + k.nelements() * 2
        if need and v.type != 'f16':
            end = pad(end) + v.nelements() * 2
        return end
    return t.nbytes()


class Hn:
    __slots__ = ('n_children', 'n_views', 'buffer_id', 'addr', 'allocated')
    def __init__(self):
        self.n_children = 0; self.n_views = 0; self.buffer_id = 0; self.addr = 0; self.allocated = False


def gallocr(nodes, leafs, trace=None, log=None):
    allocs = {CPU: DynTallocr(), GPU: DynTallocr()}
    hn = {}
    def H(t):
        h = hn.get(t.id)
        if h is None:
            h = hn[t.id] = Hn()
        return h
    live = {}  # GPU tensors currently allocated: id -> (tensor, addr, size)

    def is_allocated(t):
        return t.ext or H(t).allocated

    def alloc_node(t, be):
        h = H(t)
        if is_allocated(t) or t.view_src is not None:
            return
        h.allocated = True
        if t.op in INPLACE_OPS:
            for p in t.src:
                if p is None or not H(p).allocated:
                    continue
                if p.flags & FLAG_OUTPUT or (p.view_src is not None and p.view_src.flags & FLAG_OUTPUT):
                    continue
                if not (p.type == t.type and p.ne == t.ne and p.nb == t.nb):
                    continue
                ph = H(p)
                if ph.n_children == 1 and ph.n_views == 0:
                    if p.view_src is not None:
                        vs = p.view_src
                        vh = H(vs)
                        if vh.n_views == 1 and vh.n_children == 0:  # data == data: both NULL at reserve
                            h.buffer_id = ph.buffer_id; h.addr = vh.addr
                            if log is not None and ph.buffer_id == GPU: log.append(('I', t, h.addr, pad(alloc_size(t)), vs))
                            ph.allocated = False; vh.allocated = False
                            free_extra(t, vs, vh)
                            if ph.buffer_id == GPU:
                                live.pop(vs.id, None); live[t.id] = (t, h.addr, alloc_size(t))
                            return
                    else:
                        h.buffer_id = ph.buffer_id; h.addr = ph.addr
                        if log is not None and ph.buffer_id == GPU: log.append(('I', t, h.addr, pad(alloc_size(t)), p))
                        ph.allocated = False
                        free_extra(t, p, ph)
                        if ph.buffer_id == GPU:
                            live.pop(p.id, None); live[t.id] = (t, h.addr, alloc_size(t))
                        return
        h.buffer_id = be
        sz = alloc_size(t)
        h.addr = allocs[be].alloc(sz)
        if be == GPU and log is not None:
            log.append(('A', t, h.addr, pad(sz), allocs[GPU].max_size))
        if be == GPU:
            live[t.id] = (t, h.addr, sz)
            if trace is not None and h.addr + pad(sz) >= allocs[GPU].max_size:
                trace.append((allocs[GPU].max_size, t, sorted(((a, pad(s), x) for x, a, s in live.values()), key=lambda r: r[0])))

    def free_extra(t, parent, ph):
        ps, ns = pad(alloc_size(parent)), pad(alloc_size(t))
        assert ps >= ns
        if ps > ns:
            allocs[ph.buffer_id].free(ph.addr + ns, ps - ns)

    def free_node(t):
        if t.flags & FLAG_OUTPUT:
            return
        h = H(t)
        allocs[h.buffer_id].free(h.addr, alloc_size(t))
        if log is not None and h.buffer_id == GPU:
            log.append(('F', t, h.addr, pad(alloc_size(t)), [tuple(b) for b in allocs[GPU].blocks[:-1]]))
        h.allocated = False
        if h.buffer_id == GPU:
            live.pop(t.id, None)

    for l in leafs:
        alloc_node(l, l.backend)
    for n in nodes:
        if n.view_src is not None and n.op != 'NONE':
            H(n.view_src).n_views += 1
        if n.flags & FLAG_INPUT:
            alloc_node(n, n.backend)
        for s in n.src:
            if s is None:
                continue
            H(s).n_children += 1
            if s.flags & FLAG_INPUT:
                alloc_node(s, n.backend)
    for n in nodes:
        be = n.backend
        for p in n.src:
            if p is not None:
                alloc_node(p, be)
        alloc_node(n, be)
        for p in n.src:
            if p is None:
                continue
            ph = H(p)
            ph.n_children -= 1
            if ph.n_children == 0 and ph.n_views == 0:
                if p.view_src is not None:
                    vs = p.view_src
                    vh = H(vs)
                    vh.n_views -= 1
                    if vh.n_views == 0 and vh.n_children == 0 and vh.allocated:
                        free_node(vs)
                elif ph.allocated:
                    free_node(p)
    return allocs[GPU].max_size

# ---------------------------------------------------------------- driver
def reserve(hp, n_ctx, n_ubatch, fa, type_k, type_v, n_batch=None, trace=None, log=None):
    n_kv = pad(n_ctx, 256)                      # llama-context.cpp:290 (KV cache size, init_full n_kv)
    n_batch = n_batch or max(n_ubatch, 2048)
    n_batch = min(n_kv, n_batch)
    ub = min(n_batch, n_ubatch)
    T_ = min(n_kv, ub)                          # llama-context.cpp:629
    sizes = []
    for (t, nout) in ((T_, T_), (1, 1)):        # pp, tg (pp again gives the same as the first)
        gf = build_qwen35(hp, t, nout, n_kv, fa, type_k, type_v)
        nodes, leafs = schedule(gf)
        sizes.append(gallocr(nodes, leafs, trace if t == T_ else None, log if t == T_ else None))
    return max(sizes), sizes


QWEN36_27B = dict(e=5120, f=17408, H=24, Hkv=4, d=256, V=248320, S=128, Hk=16, Hv=48, conv=4, interval=4)
SETTINGS = [(16384, 512, False, 'f16'), (65536, 256, True, 'q8_0'), (32768, 512, True, 'q4_0'),
            (32768, 512, False, 'f16'), (32768, 256, False, 'f16'), (4096, 512, False, 'f16'),
            (4096, 256, False, 'f16'), (262144, 512, True, 'q4_0'), (200000, 512, True, 'q4_0')]

def main():
    for L in (8, 64):
        hp = dict(QWEN36_27B, L=L)
        for (c, ub, fa, ct) in SETTINGS:
            size, parts = reserve(hp, c, ub, fa, ct, ct)
            print(f'L={L:2d} n_ctx={c:6d} ub={ub:3d} fa={int(fa)} cache={ct:5s}: {size} B = {size/2**20:.4f} MiB  (pp {parts[0]}, tg {parts[1]})')

if __name__ == '__main__':
    sys.setrecursionlimit(1000000)
    threading.stack_size(512 * 1024 * 1024)
    th = threading.Thread(target=main); th.start(); th.join()

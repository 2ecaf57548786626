# Sourced by the benches of scripts/bench: builds the stand-in torch package (the fake_torch
# module of probes/python/tests with its stand-in libc10.so and libc10_cuda.so) into
# $W/fake_torch. Needs ROOT and W set; leaves T at probes/python/tests.
T=$ROOT/probes/python/tests
cp -r "$T/fake_torch" "$W/fake_torch"
mkdir -p "$W/fake_torch/torch/lib"
CXX=${CXX:-c++}
$CXX -shared -fPIC -O2 -std=c++17 -o "$W/fake_torch/torch/lib/libc10.so" "$T/fake_c10.cpp"
$CXX -shared -fPIC -O2 -std=c++17 -o "$W/fake_torch/torch/lib/libc10_cuda.so" "$T/fake_c10_cuda.cpp" \
  -L"$W/fake_torch/torch/lib" -lc10 -Wl,-rpath,'$ORIGIN'

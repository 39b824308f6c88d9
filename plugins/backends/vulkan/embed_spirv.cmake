# Turns a SPIR-V file into a C++ header: `static const uint32_t NAME[] = {...};`
# (cmake -DSPV=in.spv -DHDR=out.h -DNAME=kSpv_x -P embed_spirv.cmake)
file(READ ${SPV} hex HEX)
string(LENGTH "${hex}" n)
if(n EQUAL 0 OR NOT n MATCHES "[0-9]*[02468]$")
  message(FATAL_ERROR "embed_spirv: ${SPV} is empty")
endif()
# SPIR-V is a stream of little-endian 32-bit words: regroup the bytes as words.
string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," words "${hex}")
string(REGEX REPLACE "(([^,]*,){8})" "\\1\n  " words "${words}")
file(WRITE ${HDR} "// Generated from ${SPV}\nstatic const uint32_t ${NAME}[] = {\n  ${words}\n};\n")

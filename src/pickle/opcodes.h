// Pickle opcodes, protocols 0-5, as CPython's Lib/pickle.py names them.
#pragma once

#include <cstdint>

namespace zckpt::pickle::op {

// Protocol 0/1 (text and early binary).
constexpr uint8_t kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2';
constexpr uint8_t kFloat = 'F', kInt = 'I', kBinInt = 'J', kBinInt1 = 'K', kLong = 'L', kBinInt2 = 'M';
constexpr uint8_t kNone = 'N', kPersId = 'P', kBinPersId = 'Q', kReduce = 'R';
constexpr uint8_t kString = 'S', kBinString = 'T', kShortBinString = 'U';
constexpr uint8_t kUnicode = 'V', kBinUnicode = 'X';
constexpr uint8_t kAppend = 'a', kBuild = 'b', kGlobal = 'c', kDict = 'd', kEmptyDict = '}';
constexpr uint8_t kAppends = 'e', kGet = 'g', kBinGet = 'h', kInst = 'i', kLongBinGet = 'j';
constexpr uint8_t kList = 'l', kEmptyList = ']', kObj = 'o', kPut = 'p', kBinPut = 'q';
constexpr uint8_t kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kEmptyTuple = ')';
constexpr uint8_t kSetItems = 'u', kBinFloat = 'G';
// Protocol 2.
constexpr uint8_t kProto = 0x80, kNewObj = 0x81, kExt1 = 0x82, kExt2 = 0x83, kExt4 = 0x84;
constexpr uint8_t kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87, kNewTrue = 0x88, kNewFalse = 0x89;
constexpr uint8_t kLong1 = 0x8a, kLong4 = 0x8b;
// Protocol 3.
constexpr uint8_t kBinBytes = 'B', kShortBinBytes = 'C';
// Protocol 4.
constexpr uint8_t kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d, kBinBytes8 = 0x8e;
constexpr uint8_t kEmptySet = 0x8f, kAddItems = 0x90, kFrozenSet = 0x91, kNewObjEx = 0x92;
constexpr uint8_t kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95;
// Protocol 5.
constexpr uint8_t kByteArray8 = 0x96, kNextBuffer = 0x97, kReadonlyBuffer = 0x98;

constexpr int kHighestProtocol = 5;

}  // namespace zckpt::pickle::op
